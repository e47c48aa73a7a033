import { afterAll } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createLogger } from '../../../../shared/log.js';
import { ScopePublisher, type PublisherDeps } from '../../src/adapters/publisher.js';
import { RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';

/** One scope's publication on a real Redis and Kafka: what the owed and retirement tests share. */
export const scope = { tenant: 'acme', agent: 'a1' };

/** A Redis client and a candidates sink for the file that calls this, closed after its tests. */
export function connections() {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    redis.disconnect();
  });
  return { redis, sink };
}

/**
 * Three tasks running the same three tools (one candidate once the third completes) on partition 0, their
 * ids ending in `suffix`, their offsets from `first` on.
 */
export function threeRuns(suffix = '', first = 0): DetectorOp[] {
  const out: DetectorOp[] = [];
  let offset = first;
  for (const task of ['t1', 't2', 't3']) {
    const base = 1_000 * Number(task.slice(1));
    ['lookup', 'check', 'close'].forEach((tool, step) =>
      out.push({
        kind: 'call',
        scope,
        task: task + suffix,
        eventId: `${task}${suffix}-${step}`,
        ts: base + step,
        step,
        tool,
        cost: 10_000,
        partition: 0,
        offset: String(offset++),
      }),
    );
    out.push({
      kind: 'done',
      scope,
      task: task + suffix,
      eventId: `${task}${suffix}-done`,
      ts: base + 10,
      partition: 0,
      offset: String(offset++),
    });
  }
  return out;
}

/**
 * A fresh key prefix and compacted candidates topic, and a store whose publications may take 1 s (30 s in the
 * service): a change or claim older than that was abandoned by its instance.
 */
export async function scopeStore({ redis, sink }: ReturnType<typeof connections>, name: string) {
  const prefix = unique(name);
  const topic = unique('candidates');
  await createTopics([{ topic, partitions: 1, compacted: true }]);
  await sink.connect();
  const store = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000);
  /** A publisher of this store's scopes to this topic, with the callbacks a test watches. */
  const publisher = (extra: Partial<PublisherDeps> = {}) =>
    new ScopePublisher({
      store,
      sink,
      topic,
      params: DEFAULT_PARAMS,
      log: createLogger('test', 'silent'),
      onPublished: () => undefined,
      ...extra,
    });
  return { prefix, topic, store, publisher };
}
