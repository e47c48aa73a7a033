import { z } from 'zod';
import { jsonOf, readToEnd, type ReplayOptions } from '../../../../../shared/kafka/replay.js';
import type { Sink } from '../../../../../shared/kafka/sink.js';
import type { SessionRef } from '../redis/store.js';

/**
 * Session states on a compacted topic the sequencer owns (`SEQUENCER_STATE_TOPIC`): what survives a Redis
 * loss. One record per session write, keyed `["<key prefix>","<tenant>","<agent>","<session>"]`, holding the
 * value stored in Redis byte for byte (`<version>|<state>`: step, sequence index, recent tools, matched steps,
 * the redelivery guard; never a message text or an argument) and when it was written. Internal to the
 * service: plain JSON with these shapes rather than a public contract. The topic's records expire with the
 * sessions (`compact,delete`, retention = `SEQUENCER_SESSION_TTL_MS`).
 */
const keyShape = z.tuple([z.string(), z.string().min(1), z.string().min(1), z.string().min(1)]);
const valueV1 = z
  .object({ v: z.literal(1), value: z.string().regex(/^\d+\|/), at: z.number().int().nonnegative() })
  .strict();

export const sessionRecordKey = (prefix: string, r: SessionRef): string =>
  JSON.stringify([prefix, r.tenant, r.agent, r.session]);
export const sessionRecordValue = (stored: string, at: number): string =>
  JSON.stringify({ v: 1, value: stored, at });

/** A batch's copy of the states it writes (`createBatchHandler`'s `copy`), as main wires it. */
export const copyToSessionLog =
  (sink: Pick<Sink, 'sendRaw'>, topic: string, prefix: string) =>
  (writes: { ref: SessionRef; value: string }[]): Promise<void> =>
    sink.sendRaw(
      topic,
      writes.map((w) => ({
        key: sessionRecordKey(prefix, w.ref),
        value: sessionRecordValue(w.value, Date.now()),
      })),
    );

export interface LoggedSession {
  ref: SessionRef;
  /** The value as Redis held it (`<version>|<state>`). */
  value: string;
  /** When it was written (ms): the session expires `SEQUENCER_SESSION_TTL_MS` after. */
  at: number;
}

/**
 * Reads the whole topic (every partition from its low to its high watermark as they are now), giving the
 * sessions of `prefix` batch by batch, in offset order: a session's records are all on one partition (keyed),
 * so a later one comes after an earlier one, and a restore that keeps the higher version ends with the latest,
 * as compaction would. Memory stays at one fetch, however many sessions the topic holds. Records of other
 * prefixes are skipped; records this version cannot read are counted. Once `goOn` is false the read ends with
 * `ReplayStopped` (see `readRanges`).
 */
export async function readSessionLog(
  o: ReplayOptions,
  prefix: string,
  each: (sessions: LoggedSession[]) => Promise<void>,
  goOn: () => boolean = () => true,
): Promise<{ read: number; skipped: number }> {
  let read = 0;
  let skipped = 0;
  await readToEnd(
    o,
    async (_p, messages) => {
      const sessions: LoggedSession[] = [];
      for (const m of messages) {
        if (m.value === null) continue;
        const key = keyShape.safeParse(m.key ? jsonOf(m.key) : undefined);
        if (!key.success) {
          skipped++;
          continue;
        }
        const [p, tenant, agent, session] = key.data;
        if (p !== prefix) continue;
        const r = valueV1.safeParse(jsonOf(m.value));
        if (!r.success) {
          skipped++;
          continue;
        }
        sessions.push({ ref: { tenant, agent, session }, value: r.data.value, at: r.data.at });
      }
      read += sessions.length;
      if (sessions.length > 0) await each(sessions);
    },
    goOn,
  );
  return { read, skipped };
}
