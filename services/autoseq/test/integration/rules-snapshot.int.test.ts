import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { rng } from '../../../../testkit/streams.js';
import { learnKey, readScope } from '../../src/adapters/redis/learn-store.js';
import { restoreCutShort } from '../../../../shared/redis/rebuild.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { restoreRules } from '../../src/adapters/rules-snapshot.js';
import { learnBatch, ruleCopier, rulesReplay } from './rule-copies.js';
import { fixtureEvents } from '../learn-streams.js';
import { LOW_BAR } from './predict-compare.js';

const events = fixtureEvents();

describe('learned rules copied to a compacted topic and restored from it (real Kafka and Redis)', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });

  it('the copy of every batch written (evictions as tombstones) restores the scope exactly, once, and never over newer state', async () => {
    const prefix = unique('paver-test');
    const flag = restoreFlagKey(`${prefix}:aseq:epoch`);
    const topic = unique('autoseq-rules');
    await createTopics([{ topic, partitions: 3, compacted: true }]);
    await sink.connect();
    const { snapshots, metrics } = ruleCopier(redis, prefix, sink, topic);
    const replay = rulesReplay(topic);

    // Small bounds (LOW_BAR): eviction deletes contexts many times over the fixture. Copies are made after a
    // random number of batches, so some contexts change several times between two copies.
    const random = rng(3);
    let i = 0;
    while (i < events.length) {
      const batch = events.slice(i, i + 1 + Math.floor(random() * 30));
      i += batch.length;
      const store = await learnBatch(redis, prefix, batch, LOW_BAR, 0);
      snapshots.mark(store.written());
      if (random() < 0.3) await snapshots.flush();
    }
    await snapshots.stop();
    expect(snapshots.pending()).toBe(0);
    const counts = (kind: string) =>
      metrics.records.get().then((v) => v.values.find((x) => x.labels.kind === kind)?.value ?? 0);
    expect(await counts('context')).toBeGreaterThan(0);
    expect(await counts('tombstone')).toBeGreaterThan(0);

    const learned = await readScope(redis, prefix, 'default', 'default');
    expect(learned!.nActive).toBeGreaterThan(0);

    // Redis loses the scope: the topic gives it back as it was.
    await redis.del(learnKey(prefix, 'default', 'default'));
    expect(await readScope(redis, prefix, 'default', 'default')).toBeNull();
    const first = await restoreRules(redis, prefix, flag, replay);
    expect(first).toMatchObject({ scopes: 1, restored: 1, skipped: 0 });
    expect(first.contexts).toBe(Object.keys(learned!.ctx).length);
    expect(await readScope(redis, prefix, 'default', 'default')).toEqual(learned);
    expect(await restoreCutShort(redis, flag)).toBe(false);

    // Run again (another instance noticed the loss too), or after the scope moved on: nothing is overwritten.
    const more = events
      .slice(0, 40)
      .map((e) => ({ ...e, task_id: `again-${e.task_id}`, event_id: `again-${e.event_id}` }));
    await learnBatch(redis, prefix, more, LOW_BAR, 0);
    const moved = await readScope(redis, prefix, 'default', 'default');
    expect(moved!.clock).toBeGreaterThan(learned!.clock);
    expect(await restoreRules(redis, prefix, flag, replay)).toMatchObject({ scopes: 1, restored: 0 });
    expect(await readScope(redis, prefix, 'default', 'default')).toEqual(moved);

    // Another deployment's prefix on the same topic is not this one's.
    expect(await restoreRules(redis, unique('other'), flag, replay)).toMatchObject({
      scopes: 0,
      restored: 0,
    });
    await redis.del(learnKey(prefix, 'default', 'default'));
  });
});
