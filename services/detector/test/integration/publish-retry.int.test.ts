import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createLogger } from '../../../../shared/log.js';
import {
  consumeUntil,
  createTopics,
  testKafka,
  testRedis,
  unique,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import { ScopePublisher } from '../../src/adapters/publisher.js';
import { detectorKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';
import { scope, threeRuns } from './scope-fixture.js';

/*
 * A publication that fails after its apply succeeded: the change is owed in Redis, but the batch's redelivery
 * finds only duplicates and leaves a change that young alone, so nothing published it until a later batch of the
 * scope or the once-a-minute sweep (up to about 90 s). The producer is stopped for real here (disconnected), with
 * the service's 30 s publication lock, no further batch and no sweep.
 */
const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  redis.disconnect();
});

describe('detector: a candidate publication that fails is retried by its instance', () => {
  it('gives up its lock and publishes the change once the producer is back, with no batch and no sweep', async () => {
    const prefix = unique('det-pubretry');
    const topic = unique('candidates');
    await createTopics([{ topic, partitions: 1, compacted: true }]);
    // The service's publication lock (30 s): the retry must not wait it out.
    const store = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix);
    const published: string[] = [];
    const publisher = new ScopePublisher({
      store,
      sink,
      topic,
      params: DEFAULT_PARAMS,
      log: createLogger('test', 'silent'),
      onPublished: (status, n) => {
        for (let i = 0; i < n; i++) published.push(status);
      },
    });
    expect((await store.applyBatch(threeRuns())).changed).toEqual([scope]);

    // The producer is stopped: the publication fails after the apply, and the batch with it (as in main.ts).
    await sink.connect();
    await sink.disconnect();
    await expect(publisher.publish(scope, true)).rejects.toThrow();
    expect(published).toEqual([]);
    expect(await store.isOwed(scope)).toBe(true);
    // Its lock is given up at once (it held it for its TTL). Whether its retry is still waiting here depends on
    // how loaded the machine is (it fires after a second, fails while the producer is stopped, and waits again),
    // so only the outcome below is asserted.
    expect(await redis.exists(detectorKeys(prefix, scope).lock)).toBe(0);
    // The redelivered batch: only duplicates, and the change too young for a batch to take up.
    const again = await store.applyBatch(threeRuns());
    expect(again.changed).toEqual([]);
    expect(again.owed).toEqual([]);

    await sink.connect();
    await waitFor(() => published.length > 0, 'the failed publication to be retried');
    expect(published).toEqual(['active']);
    await waitFor(async () => !(await store.isOwed(scope)), 'the change to be released');
    const records = await consumeUntil(topic, (all) => all.length > 0);
    expect(records.map((r) => (JSON.parse(String(r.value)) as { status: string }).status)).toEqual([
      'active',
    ]);
    expect(publisher.waiting).toBe(0);
    await publisher.close();
  });
});
