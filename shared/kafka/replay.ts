import { randomUUID } from 'node:crypto';
import type { Kafka, KafkaMessage } from 'kafkajs';
import type { CommonEnv } from '../config.js';
import { errorMessage, PaverError } from '../errors.js';
import { membershipChange } from './runner.js';

/** Offsets [from, end) of one partition. */
export interface OffsetRange {
  from: bigint;
  end: bigint;
}

export interface ReplayOptions {
  kafka: Kafka;
  topic: string;
  /** Prefix of the throwaway group's id (deleted afterwards). */
  groupPrefix: string;
  sessionTimeoutMs: number;
  maxBytesPerPartition: number;
}

/** A service's replay reader for `topic`: its throwaway groups named after `groupPrefix`, the consumer settings its own. */
export const replayOptions = (
  kafka: Kafka,
  env: Pick<CommonEnv, 'KAFKA_SESSION_TIMEOUT_MS' | 'KAFKA_MAX_BYTES_PER_PARTITION'>,
  topic: string,
  groupPrefix: string,
): ReplayOptions => ({
  kafka,
  topic,
  groupPrefix,
  sessionTimeoutMs: env.KAFKA_SESSION_TIMEOUT_MS,
  maxBytesPerPartition: env.KAFKA_MAX_BYTES_PER_PARTITION,
});

/**
 * A replay given up because its caller stopped wanting it: the consumer or service it runs for is stopping
 * (SIGTERM) or lost the partition. `SHUTTING_DOWN`, so no retry runs it again and the runner ends the batch
 * uncommitted.
 */
export class ReplayStopped extends PaverError {
  constructor(topic: string) {
    super('SHUTTING_DOWN', `replay of ${topic} stopped: its consumer is stopping or lost the partition`);
  }
}

/**
 * A replay its consumer gave up: stopped (`ReplayStopped`), or its heartbeat refused by a rebalance. Not a
 * failure: the partition's next owner replays it again.
 */
export const replayGivenUp = (err: unknown): boolean =>
  err instanceof ReplayStopped || membershipChange(err) !== null;

/** How a partition's rebuild by replay ended (ingest's pending spans, the detector's window). */
export type PartitionRebuildOutcome = 'rebuilt' | 'retried' | 'stopped' | 'failed';

/** How often a replay asks `goOn` besides between batches: a stop must not wait for a slow fetch or a join. */
const GO_ON_CHECK_MS = 100;

/**
 * Reads [from, end) of some partitions of a topic, in order, through `onBatch`. kafkajs has no `assign()`, so
 * this is a throwaway consumer group that seeks each wanted partition to its start and pauses every other
 * one; it commits nothing and is deleted afterwards. Ranges starting below the partition's low watermark
 * (retention removed them) start at the low watermark: `lowWatermarks` says where that was.
 *
 * `goOn` (a batch context's `isRunning`) is asked before each batch and every GO_ON_CHECK_MS: once false, the
 * replay ends with `ReplayStopped` after the batch in hand, if any. A long replay under a batch otherwise held
 * the consumer's stop until PAVER_SHUTDOWN_TIMEOUT_MS ran out (exit 1), or went on for a partition already
 * given to another instance.
 */
export async function readRanges(
  o: ReplayOptions,
  ranges: Map<number, OffsetRange>,
  onBatch: (partition: number, messages: KafkaMessage[]) => Promise<void>,
  goOn: () => boolean = () => true,
): Promise<{ lowWatermarks: Map<number, bigint> }> {
  if (!goOn()) throw new ReplayStopped(o.topic);
  const admin = o.kafka.admin();
  const lowWatermarks = new Map<number, bigint>();
  try {
    await admin.connect();
    for (const p of await admin.fetchTopicOffsets(o.topic)) lowWatermarks.set(p.partition, BigInt(p.low));
  } catch (err) {
    throw new PaverError('KAFKA_UNAVAILABLE', `replay of ${o.topic}: ${errorMessage(err)}`, { cause: err });
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
  const todo = new Map<number, OffsetRange>();
  for (const [p, r] of ranges) {
    const from = r.from > (lowWatermarks.get(p) ?? 0n) ? r.from : (lowWatermarks.get(p) ?? 0n);
    if (r.end > from) todo.set(p, { from, end: r.end });
  }
  if (todo.size === 0) return { lowWatermarks };

  const groupId = `${o.groupPrefix}-replay-${randomUUID()}`;
  const consumer = o.kafka.consumer({
    groupId,
    sessionTimeout: o.sessionTimeoutMs,
    heartbeatInterval: Math.floor(o.sessionTimeoutMs / 10),
    maxBytesPerPartition: o.maxBytesPerPartition,
    allowAutoTopicCreation: false,
    retry: { retries: 5 },
  });
  const left = new Set(todo.keys());
  let settle!: (err?: unknown) => void;
  const done = new Promise<void>((resolve, reject) => {
    settle = (err) => (err === undefined ? resolve() : reject(err));
  });
  // Settled (a stop, a crash) while the consumer still joins: awaited only after that, and must not count as
  // unhandled meanwhile.
  done.catch(() => undefined);
  const watch = setInterval(() => {
    if (!goOn()) settle(new ReplayStopped(o.topic));
  }, GO_ON_CHECK_MS);
  consumer.on(consumer.events.CRASH, (e) => {
    if (!e.payload.restart) settle(e.payload.error);
  });
  const reached = (partition: number, lastOffset: string, r: OffsetRange) => {
    if (BigInt(lastOffset) + 1n < r.end) return false;
    left.delete(partition);
    if (left.size === 0) settle();
    return true;
  };
  // A fetch holding only records no consumer is given (a transaction marker, an aborted transaction) never
  // reaches eachBatch, though kafkajs moves past it: a range ending there is read to its end all the same.
  consumer.on(consumer.events.END_BATCH_PROCESS, (e) => {
    const { partition, batchSize, lastOffset } = e.payload;
    const r = todo.get(partition);
    if (batchSize === 0 && r && left.has(partition) && reached(partition, lastOffset, r))
      consumer.pause([{ topic: o.topic, partitions: [partition] }]);
  });
  try {
    await consumer.connect();
    await consumer.subscribe({ topic: o.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      eachBatch: async ({ batch, pause, heartbeat, resolveOffset }) => {
        const r = todo.get(batch.partition);
        if (!r || !left.has(batch.partition)) {
          pause();
          return;
        }
        if (!goOn()) {
          pause();
          settle(new ReplayStopped(o.topic));
          return;
        }
        try {
          // A fetch in flight before the seek, or a batch reaching past the end: keep only the range.
          const msgs = batch.messages.filter((m) => {
            const off = BigInt(m.offset);
            return off >= r.from && off < r.end;
          });
          if (msgs.length > 0) await onBatch(batch.partition, msgs);
          // Nothing is committed (the group is thrown away), but the fetch position moves on only when resolved.
          resolveOffset(batch.lastOffset());
          await heartbeat();
        } catch (err) {
          pause();
          settle(err);
          return;
        }
        if (reached(batch.partition, batch.lastOffset(), r)) pause();
      },
    });
    for (const [partition, r] of todo)
      consumer.seek({ topic: o.topic, partition, offset: r.from.toString() });
    await done;
    return { lowWatermarks };
  } finally {
    clearInterval(watch);
    await consumer.disconnect().catch(() => undefined);
    const cleanup = o.kafka.admin();
    await cleanup.connect().catch(() => undefined);
    await cleanup.deleteGroups([groupId]).catch(() => undefined);
    await cleanup.disconnect().catch(() => undefined);
  }
}

/** Reads every partition of a topic from its low to its high watermark as they are now; `goOn` as for `readRanges`. */
export async function readToEnd(
  o: ReplayOptions,
  onBatch: (partition: number, messages: KafkaMessage[]) => Promise<void>,
  goOn: () => boolean = () => true,
): Promise<void> {
  const admin = o.kafka.admin();
  let ends: { partition: number; high: string; low: string }[];
  try {
    await admin.connect();
    ends = await admin.fetchTopicOffsets(o.topic);
  } catch (err) {
    throw new PaverError('KAFKA_UNAVAILABLE', `read of ${o.topic}: ${errorMessage(err)}`, { cause: err });
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
  await readRanges(
    o,
    new Map(ends.map((e) => [e.partition, { from: BigInt(e.low), end: BigInt(e.high) }])),
    onBatch,
    goOn,
  );
}

/**
 * The latest value of each key of a (compacted) topic as it is now, read to its end: what compaction keeps, a
 * tombstone as null. Records without a key are skipped. For the internal copies services restore from.
 */
export async function readLatest(
  o: ReplayOptions,
  goOn: () => boolean = () => true,
): Promise<Map<string, Buffer | null>> {
  const latest = new Map<string, Buffer | null>();
  await readToEnd(
    o,
    (_p, messages) => {
      for (const m of messages) if (m.key) latest.set(m.key.toString('utf8'), m.value);
      return Promise.resolve();
    },
    goOn,
  );
  return latest;
}

/** JSON text (a record's key or value) parsed, or undefined when it is not JSON. */
export function jsonOf(b: Buffer | string): unknown {
  try {
    return JSON.parse(typeof b === 'string' ? b : b.toString('utf8')) as unknown;
  } catch {
    return undefined;
  }
}
