import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Kafka, logLevel, Partitioners, type IHeaders } from 'kafkajs';
import { Redis } from 'ioredis';
import { inject } from 'vitest';
import { errorMessage } from '../../shared/errors.js';
import { waitForTopicsReady } from '../../shared/kafka/topics.js';

export const stack = () => inject('stack');
export const unique = (prefix: string) =>
  `${prefix}-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;

export function testKafka(): Kafka {
  return new Kafka({ clientId: 'paver-test', brokers: [stack().brokers], logLevel: logLevel.NOTHING });
}
export function testRedis(): Redis {
  return new Redis(stack().redisUrl, { lazyConnect: false, maxRetriesPerRequest: 2 });
}

/** Polls until `check` returns a truthy value; no fixed sleeps in assertions. */
export async function waitFor<T>(
  check: () => Promise<T | undefined | null | false> | T | undefined | null | false,
  what: string,
  timeoutMs = 60_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${errorMessage(last)}` : ''}`,
      );
    await sleep(100);
  }
}

/**
 * Creates the topics and returns once every partition answers on its leader. Not kafkajs's `waitForLeaders`: it
 * retries only LEADER_NOT_AVAILABLE, and a starved KRaft broker answers the metadata of a topic it has just
 * created with "This server does not host this topic-partition" for a while, which it threw at once (seen in
 * the runner tests under two CPU hogs). The services wait with the same check (`waitForTopicsReady`).
 */
export async function createTopics(
  topics: { topic: string; partitions?: number; compacted?: boolean; config?: Record<string, string> }[],
) {
  const admin = testKafka().admin();
  await admin.connect();
  await admin.createTopics({
    waitForLeaders: false,
    topics: topics.map((t) => ({
      topic: t.topic,
      numPartitions: t.partitions ?? 3,
      replicationFactor: 1,
      configEntries: [
        ...(t.compacted ? [{ name: 'cleanup.policy', value: 'compact' }] : []),
        ...Object.entries(t.config ?? {}).map(([name, value]) => ({ name, value })),
      ],
    })),
  });
  try {
    await waitForTopicsReady(
      admin,
      topics.map((t) => t.topic),
      120_000,
    );
  } finally {
    await admin.disconnect();
  }
}

/**
 * Writes `batches` in transactions, one each, committed or aborted as asked: as exactly-once writers (Kafka
 * Streams, Connect, Flink) do, each transaction ends with a marker no consumer is given.
 */
export async function produceInTransactions(
  topic: string,
  batches: { messages: { key: string | null; value: string }[]; commit: boolean }[],
): Promise<void> {
  const producer = testKafka().producer({
    transactionalId: unique('tx'),
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await producer.connect();
  try {
    for (const b of batches) {
      const tx = await producer.transaction();
      await tx.send({ topic, acks: -1, messages: b.messages });
      await (b.commit ? tx.commit() : tx.abort());
    }
  } finally {
    await producer.disconnect();
  }
}

/**
 * `n` records sent one per request, 50 requests at a time: each its own record batch, so a consumer with a small
 * `KAFKA_MAX_BYTES_PER_PARTITION` reads them one fetch each (a long read, to stop in the middle of).
 */
export async function produceOnePerBatch(
  topic: string,
  n: number,
  record: (i: number) => { key: string; value: string },
): Promise<void> {
  const producer = testKafka().producer();
  await producer.connect();
  try {
    for (let i = 0; i < n; i += 50)
      await Promise.all(
        Array.from({ length: Math.min(50, n - i) }, (_, j) =>
          producer.send({ topic, acks: -1, messages: [record(i + j)] }),
        ),
      );
  } finally {
    await producer.disconnect();
  }
}

export async function produce(
  topic: string,
  messages: {
    key?: string | null;
    value: Buffer | string;
    headers?: IHeaders;
    partition?: number;
    /** The record's timestamp (ms, CreateTime), for records stamped in the past. */
    timestamp?: number;
  }[],
) {
  const producer = testKafka().producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  for (let i = 0; i < messages.length; i += 1000) {
    await producer.send({
      topic,
      acks: -1,
      messages: messages.slice(i, i + 1000).map((m) => ({
        key: m.key ?? null,
        value: m.value,
        headers: m.headers ?? {},
        ...(m.partition !== undefined ? { partition: m.partition } : {}),
        ...(m.timestamp !== undefined ? { timestamp: String(m.timestamp) } : {}),
      })),
    });
  }
  await producer.disconnect();
}

export interface Consumed {
  key: string | null;
  value: Buffer | null;
  headers: Record<string, string>;
  partition: number;
  offset: string;
}

/**
 * Reads a topic from the beginning until `done(all)` holds. A reader that has received nothing after 30 s
 * (seen once in the full suite: a fresh group stuck before its first fetch) is replaced by a new one.
 */
export async function consumeUntil(
  topic: string,
  done: (all: Consumed[]) => boolean,
  timeoutMs = 120_000,
): Promise<Consumed[]> {
  const deadline = Date.now() + timeoutMs;
  for (let attempt = 1; ; attempt++) {
    const consumer = testKafka().consumer({ groupId: unique('reader'), maxWaitTimeInMs: 100 });
    const all: Consumed[] = [];
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ message, partition }) => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = String(v);
        all.push({
          key: message.key?.toString() ?? null,
          value: message.value,
          headers,
          partition,
          offset: message.offset,
        });
      },
    });
    const started = Date.now();
    const stuck = () => all.length === 0 && Date.now() - started > 30_000 && deadline - Date.now() > 5_000;
    try {
      await waitFor(() => done(all) || stuck(), `messages on ${topic}`, deadline - started).catch(
        (err: Error) => {
          // The count when the wait gave up (a description is fixed before the wait begins).
          throw new Error(`${err.message} (read ${all.length})`);
        },
      );
    } finally {
      await consumer.disconnect();
    }
    if (done(all)) return all;
    if (attempt >= 4) throw new Error(`no messages on ${topic} after ${attempt} readers`);
  }
}

/** True once the group's committed offsets reach the end of every non-empty partition of `topic`. */
export async function groupCaughtUp(groupId: string, topic: string): Promise<boolean> {
  const admin = testKafka().admin();
  await admin.connect();
  try {
    const ends = await admin.fetchTopicOffsets(topic);
    const [committed] = await admin.fetchOffsets({ groupId, topics: [topic] });
    return ends.every(
      (e) =>
        e.high === e.low ||
        BigInt(committed?.partitions.find((c) => c.partition === e.partition)?.offset ?? '-1') >=
          BigInt(e.high),
    );
  } finally {
    await admin.disconnect();
  }
}
