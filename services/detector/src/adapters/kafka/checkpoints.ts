import { z } from 'zod';
import type { Sink } from '../../../../../shared/kafka/sink.js';
import { jsonOf, readLatest, type ReplayOptions } from '../../../../../shared/kafka/replay.js';

/**
 * The detector's replay checkpoints, on a compacted topic it owns: per (Redis key prefix, input topic,
 * partition), the offset from which a rebuild must replay that partition to see again every open task and
 * window record it holds. Kept outside Redis on purpose: it is what survives a Redis loss.
 */
export const checkpointRecordV1 = z
  .object({
    v: z.literal(1),
    prefix: z.string(),
    topic: z.string().min(1),
    partition: z.number().int().min(0),
    offset: z.string().regex(/^\d+$/),
    written_at: z.number().int(),
  })
  .strict();
export type CheckpointRecord = z.infer<typeof checkpointRecordV1>;

export const checkpointKey = (prefix: string, topic: string, partition: number): string =>
  JSON.stringify([prefix, topic, partition]);

export class CheckpointLog {
  /** Latest offset per partition: read from the topic once, then what this process wrote. */
  private known: Map<number, bigint> | null = null;

  constructor(
    private readonly sink: Sink,
    private readonly replay: ReplayOptions,
    private readonly prefix: string,
    private readonly inputTopic: string,
  ) {}

  /** The checkpoint of `partition`, or null when none was ever written (replay from the earliest offset). */
  async get(partition: number): Promise<bigint | null> {
    if (this.known === null) this.known = await this.load();
    return this.known.get(partition) ?? null;
  }

  async write(partition: number, offset: bigint, now = Date.now()): Promise<void> {
    const rec: CheckpointRecord = checkpointRecordV1.parse({
      v: 1,
      prefix: this.prefix,
      topic: this.inputTopic,
      partition,
      offset: offset.toString(),
      written_at: now,
    });
    await this.sink.sendRaw(this.replay.topic, [
      { key: checkpointKey(this.prefix, this.inputTopic, partition), value: JSON.stringify(rec) },
    ]);
    this.known?.set(partition, offset);
  }

  /** Reads the whole (small, compacted) topic; records of other prefixes or topics, or unreadable ones, are skipped. */
  private async load(): Promise<Map<number, bigint>> {
    const out = new Map<number, bigint>();
    // The latest record of each key, as compaction keeps it.
    for (const value of (await readLatest(this.replay)).values()) {
      if (value === null) continue;
      const r = checkpointRecordV1.safeParse(jsonOf(value));
      if (!r.success || r.data.prefix !== this.prefix || r.data.topic !== this.inputTopic) continue;
      out.set(r.data.partition, BigInt(r.data.offset));
    }
    return out;
  }
}
