import type { DeadLetterReason } from '../../schemas/index.js';
import type { Decoded } from './decode.js';

/** One decoded, validated message; offsets are strings everywhere (normalised here, once). */
export interface InboundRecord<T> {
  topic: string;
  partition: number;
  offset: string;
  key: string | null;
  timestamp: string;
  value: T;
}

export interface Rejection {
  offset: string;
  reason: DeadLetterReason;
  detail: string;
}

export interface BatchContext {
  heartbeat(): Promise<void>;
  isRunning(): boolean;
  /**
   * Aborted when the batch is to stop (the service stops, the partition is revoked or the group rebalances): a
   * step that waits on something slow (a model call) passes it on, so the stop or the rebalance does not wait
   * for that step. The runner always sets it; a handler called outside the runner (a test, a replay) may go
   * without.
   */
  signal?: AbortSignal;
}

/** The service's effect for a chunk of valid records. Return rejections for domain-invalid records. */
export type BatchHandler<T> = (
  records: InboundRecord<T>[],
  ctx: BatchContext,
) => Promise<{ rejected?: Rejection[] } | void>;

/** The slice of a Kafka message the runner uses (kafkajs's KafkaMessage fits). */
export interface RawMessage {
  offset: string;
  key: Buffer | null;
  value: Buffer | null;
  timestamp: string;
}

export interface BadRecord<M extends RawMessage = RawMessage> {
  msg: M;
  topic: string;
  partition: number;
  reason: DeadLetterReason;
  detail: string;
}

/**
 * One chunk of one partition, in the order that makes at-least-once hold: decode every message, run the
 * handler on the good ones, dead-letter the bad ones and the handler's rejections. It resolves only when all
 * effects are written; the caller commits after it, never before. Any throw leaves the chunk uncommitted.
 *
 * Decoding is synchronous: only a message that needs I/O to decode (a registry lookup) goes through
 * `decodeAsync` and the retry policy, so the common case costs no promise per message.
 */
export async function processChunk<T, M extends RawMessage>(a: {
  topic: string;
  partition: number;
  chunk: M[];
  /** A typed value or a dead-letter reason, or `undefined` when only `decodeAsync` can answer. */
  decode: (msg: M) => Decoded<T> | undefined;
  /** Decodes what needs I/O (Confluent framing); may throw what a retry cures. */
  decodeAsync: (msg: M) => Promise<Decoded<T>>;
  handler: BatchHandler<T>;
  ctx: BatchContext;
  /** Wraps each effect in the runner's retry policy. */
  retry: <R>(fn: () => Promise<R>) => Promise<R>;
  deadLetter: (bad: BadRecord<M>[]) => Promise<void>;
}): Promise<{ processed: number; deadLettered: number; last: string }> {
  const { topic, partition } = a;
  const good: InboundRecord<T>[] = [];
  const bad: BadRecord<M>[] = [];
  for (const msg of a.chunk) {
    const r = a.decode(msg) ?? (await a.retry(() => a.decodeAsync(msg)));
    if (r.ok)
      good.push({
        topic,
        partition,
        offset: msg.offset,
        key: msg.key === null ? null : msg.key.toString('utf8'),
        timestamp: msg.timestamp,
        value: r.value,
      });
    else bad.push({ msg, topic, partition, reason: r.reason, detail: r.detail });
  }
  let rejected = 0;
  if (good.length > 0) {
    const result = await a.retry(() => a.handler(good, a.ctx));
    const rejections = result?.rejected ?? [];
    if (rejections.length > 0) {
      // Rejections are rare: the offset index is built only when there are some.
      const byOffset = new Map(a.chunk.map((m) => [m.offset, m]));
      for (const rej of rejections) {
        const msg = byOffset.get(rej.offset);
        if (msg) {
          bad.push({ msg, topic, partition, reason: rej.reason, detail: rej.detail });
          rejected++;
        }
      }
    }
  }
  if (bad.length > 0) await a.retry(() => a.deadLetter(bad));
  return {
    processed: good.length - rejected,
    deadLettered: bad.length,
    last: a.chunk[a.chunk.length - 1]!.offset,
  };
}
