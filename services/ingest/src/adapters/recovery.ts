import type { ConfigResourceTypes, Kafka, KafkaMessage } from 'kafkajs';
import { errorMessage, PaverError } from '../../../../shared/errors.js';
import type { BatchContext } from '../../../../shared/kafka/chunk.js';
import {
  readRanges,
  replayGivenUp,
  type PartitionRebuildOutcome,
  type ReplayOptions,
} from '../../../../shared/kafka/replay.js';
import type { Logger } from '../../../../shared/log.js';
import type { Epoch, EpochMarker } from '../../../../shared/redis/epoch.js';
import type { OtlpSpan } from '../core/otlp.js';
import type { ApplyMode } from './handler.js';
import type { RedisTraceStore } from './trace-store.js';

/**
 * Reads one input partition's messages in [from, end) as spans, batch by batch, while `goOn` holds (else it
 * throws `ReplayStopped`). Resolves to the number of messages read.
 */
export type PartitionReplay = (
  partition: number,
  from: bigint,
  end: bigint,
  each: (messages: OtlpSpan[][]) => Promise<void>,
  goOn: () => boolean,
) => Promise<number>;

/** Where a partition's replay starts: its first offset at or after `timestampMs` (the end when there is none). */
export type OffsetAt = (partition: number, timestampMs: number) => Promise<bigint>;

/** A replay through a throwaway consumer group (shared/kafka/replay.ts); `decode` is the live path's decoder. */
export function otlpReplay(
  o: ReplayOptions,
  decode: (m: KafkaMessage) => Promise<OtlpSpan[] | null>,
): PartitionReplay {
  return async (partition, from, end, each, goOn) => {
    let read = 0;
    await readRanges(
      o,
      new Map([[partition, { from, end }]]),
      async (_p, messages) => {
        const spans: OtlpSpan[][] = [];
        for (const m of messages) {
          // A message that does not decode was dead-lettered when first read: it made no state then either.
          const s = await decode(m);
          if (s) spans.push(s);
        }
        await each(spans);
        read += messages.length;
      },
      goOn,
    );
    return read;
  };
}

export function offsetAtTimestamp(kafka: Kafka, topic: string): OffsetAt {
  return async (partition, timestampMs) => {
    const admin = kafka.admin();
    try {
      await admin.connect();
      const offsets = await admin.fetchTopicOffsetsByTimestamp(topic, timestampMs);
      const at = offsets.find((o) => o.partition === partition);
      if (!at) throw new Error(`partition ${partition} not found`);
      return BigInt(at.offset);
    } catch (err) {
      throw new PaverError('KAFKA_UNAVAILABLE', `offset by time on ${topic}: ${errorMessage(err)}`, {
        cause: err,
      });
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  };
}

/** kafkajs's `ConfigResourceTypes.TOPIC` (see shared/kafka/topics.ts: the enum is not importable from ESM). */
const TOPIC_RESOURCE = 2 as ConfigResourceTypes;

/**
 * The topic's `retention.ms` when it keeps less than `ttlMs`, else null (kept longer, or for good). A rebuild
 * reads the last `ttlMs` of the topic again; what retention removed is not there to read, so after a Redis loss a
 * tool span older than the retention stays lost, and nothing else would say so.
 */
export async function shortRetention(kafka: Kafka, topic: string, ttlMs: number): Promise<number | null> {
  const admin = kafka.admin();
  try {
    await admin.connect();
    const res = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: TOPIC_RESOURCE, name: topic, configNames: ['retention.ms'] }],
    });
    const value = res.resources[0]?.configEntries.find((e) => e.configName === 'retention.ms')?.configValue;
    const ms = Number(value ?? '-1');
    return ms >= 0 && ms < ttlMs ? ms : null;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

/** `shortRetention` as a start-up warning; a refused or failed read skips only this check. */
export async function warnOnShortRetention(
  kafka: Kafka,
  topic: string,
  ttlMs: number,
  log: Logger,
): Promise<void> {
  try {
    const retentionMs = await shortRetention(kafka, topic, ttlMs);
    if (retentionMs !== null)
      log.warn(
        { topic, retentionMs, pendingTtlMs: ttlMs },
        'the OTLP topic keeps less than INGEST_PENDING_TTL_MS (retention.ms): after a Redis loss, tool spans older than its retention cannot be read again and their tasks lose them; raise retention.ms',
      );
  } catch (err) {
    // Not allowed to read topic configs (an ACL), or a broker hiccup.
    log.debug({ topic, err: errorMessage(err) }, 'OTLP topic retention not checked');
  }
}

export interface RecoveryHooks {
  started(partition: number): void;
  finished(partition: number, outcome: PartitionRebuildOutcome, messages: number): void;
}

const MAX_ATTEMPTS = 5;

class LostAgain extends Error {}

/**
 * Redis loss, survived: the tool spans waiting for their agent span (and the tasks already published) live
 * only in Redis, and their messages are committed. A partition's state is trusted once it is known complete
 * under the current epoch (`rebuilt` records, per partition, the epoch it was last rebuilt in). When the marker
 * is gone or replaced, or the partition was never rebuilt under it, the partition's last `ttlMs` of messages
 * (what the state can hold: a trace's hash expires `ttlMs` after its last change) are read again up to the
 * chunk in hand, through the same code as live traffic but publishing nothing: each task whose agent span is
 * among them was published when it was first read.
 *
 * Per partition, with no global pause: a trace's spans are on one partition (the guarantee needs
 * `partition_traces_by_id`), so partitions are rebuilt independently by whichever instance owns them.
 *
 * A replay stops between batches once the chunk's consumer stops (SIGTERM) or loses the partition
 * (`ctx.isRunning()`): the partition is left unmarked and the chunk uncommitted, so the partition's next
 * owner (this process after a restart, or another instance) rebuilds it again from the start. What the
 * abandoned replay wrote is written again then, as any chunk read twice is.
 */
export class PendingRecovery {
  private readonly verified = new Map<number, string>();
  private active = 0;

  constructor(
    private readonly d: {
      store: RedisTraceStore;
      /** The input topic: its partitions' rebuild marks are its own. */
      topic: string;
      epoch: Epoch;
      ttlMs: number;
      offsetAt: OffsetAt;
      replay: PartitionReplay;
      apply: (messages: OtlpSpan[][], mode: ApplyMode) => Promise<{ lost: boolean }>;
      log: Logger;
      hooks: RecoveryHooks;
      now?: () => number;
    },
  ) {}

  isRebuilding(): boolean {
    return this.active > 0;
  }

  /** A chunk found the state gone: the next `ensure` checks the marker again. */
  invalidate(partition: number): void {
    this.verified.delete(partition);
  }

  /**
   * Makes sure `partition`'s state is in Redis before a chunk starting at `end` is handled, rebuilding it when
   * it is not. Returns the marker the chunk's reads are checked against.
   */
  async ensure(partition: number, end: bigint, ctx: BatchContext, endTs?: number): Promise<EpochMarker> {
    const key = this.d.epoch.key;
    const seen = this.verified.get(partition);
    if (seen !== undefined && seen === this.d.epoch.current()) return { key, value: seen };
    for (let attempt = 1; ; attempt++) {
      const { epoch } = await this.d.epoch.check();
      if ((await this.d.store.rebuiltIn(this.d.topic, partition)) === epoch) {
        this.verified.set(partition, epoch);
        return { key, value: epoch };
      }
      if (await this.rebuild(partition, epoch, end, ctx, endTs)) return { key, value: epoch };
      if (attempt >= MAX_ATTEMPTS)
        throw new PaverError(
          'REDIS_UNAVAILABLE',
          `ingest state lost again during ${attempt} rebuild attempts of partition ${partition}`,
        );
    }
  }

  private async rebuild(
    partition: number,
    epoch: string,
    end: bigint,
    ctx: BatchContext,
    endTs?: number,
  ): Promise<boolean> {
    const { store, log, hooks, ttlMs } = this.d;
    const now = this.d.now ?? Date.now;
    this.active++;
    hooks.started(partition);
    const t0 = now();
    let messages = 0;
    let outcome: PartitionRebuildOutcome = 'failed';
    try {
      // The last ttlMs before the chunk, by record time: a consumer lagging by more than ttlMs holds in Redis
      // spans stamped long before now (they expire ttlMs after they were handled, not after their stamp), and
      // `now - ttlMs` found nothing to read for it. Never later than now: a producer clock running ahead
      // must not shorten the replay. A record with no time (-1, the old format's) or stamped 0 says nothing of
      // the stream's: now, as before. The broker refuses a negative time that is not one of its special
      // values (UNSUPPORTED_VERSION, retried for ever: the partition stuck), so none is asked for.
      const upTo = endTs !== undefined && Number.isFinite(endTs) && endTs > 0 ? Math.min(t0, endTs) : t0;
      // A partition's first chunk at offset 0 has nothing before it: no lookup.
      const fromOffset = end === 0n ? 0n : await this.d.offsetAt(partition, Math.max(0, upTo - ttlMs));
      const where = { partition, from: fromOffset.toString(), to: end.toString() };
      if (fromOffset >= end) {
        // Nothing in the last ttlMs before this chunk (a first start, or a quiet partition): nothing to lose.
        log.info(where, 'ingest state for this partition starts here: nothing before it to replay');
      } else {
        log.warn(
          where,
          'ingest state for this partition is not in Redis (lost, or never built in this epoch): replaying its pending spans from Kafka',
        );
        const marker = { key: this.d.epoch.key, value: epoch };
        try {
          // Written with the whole TTL, as live traffic writes: a trace given only what was left of its first
          // replayed change's time could expire before the replay reached its later changes, and lose them.
          messages = await this.d.replay(
            partition,
            fromOffset,
            end,
            async (batch) => {
              if ((await this.d.apply(batch, { publish: false, marker })).lost) throw new LostAgain();
              await ctx.heartbeat();
            },
            () => ctx.isRunning(),
          );
        } catch (err) {
          // A rebalance fails the replay's heartbeat: no failure either, the partition's next owner rebuilds it.
          if (replayGivenUp(err)) {
            outcome = 'stopped';
            log.info(
              where,
              'ingest state rebuild stopped (consumer stopping or partition moved): done again by its next owner',
            );
          }
          if (!(err instanceof LostAgain)) throw err;
          outcome = 'retried';
          return false;
        }
      }
      await store.markRebuilt(this.d.topic, partition, epoch);
      // The marker must still be the one rebuilt under; if not, the state went again meanwhile.
      if ((await this.d.epoch.check()).epoch !== epoch) {
        outcome = 'retried';
        return false;
      }
      this.verified.set(partition, epoch);
      outcome = 'rebuilt';
      if (messages > 0)
        log.info({ partition, messages, ms: now() - t0 }, 'ingest partition state rebuilt from Kafka');
      return true;
    } finally {
      this.active--;
      hooks.finished(partition, outcome, messages);
    }
  }
}
