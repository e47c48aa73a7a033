import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { createTopics, testKafka, testRedis, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { learnKey, readScope } from '../../src/adapters/redis/learn-store.js';
import { restoreRules } from '../../src/adapters/rules-snapshot.js';
import { learnBatch, ruleCopier, rulesReplay } from './rule-copies.js';
import { fixtureEvents } from '../learn-streams.js';
import { LOW_BAR } from './predict-compare.js';

const events = fixtureEvents();

describe('a scope idle for AUTOSEQ_LEARN_SCOPE_TTL_MS goes (real Kafka and Redis)', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });

  const learn = (prefix: string, batch: ToolCallsEvent[], scopeTtlMs: number) =>
    learnBatch(redis, prefix, batch, LOW_BAR, scopeTtlMs);

  it('each write renews the rules for the TTL; without one they expire as a whole; at 0 they never do', async () => {
    const prefix = unique('paver-test');
    const key = learnKey(prefix, 'default', 'default');
    await learn(prefix, events.slice(0, 60), 8000);
    const first = await redis.pttl(key);
    expect(first).toBeGreaterThan(0);
    expect(first).toBeLessThanOrEqual(8000);
    // Some of the lifetime passes; the next batch gives the whole of it back.
    await waitFor(async () => (await redis.pttl(key)) < first - 1000, 'the TTL running down');
    const before = await redis.pttl(key);
    await learn(prefix, events.slice(60, 120), 8000);
    expect(await redis.pttl(key)).toBeGreaterThan(before);
    // No more batches: the scope goes, every context with it.
    await waitFor(async () => (await redis.exists(key)) === 0, 'the idle scope expiring', 30_000);
    expect(await readScope(redis, prefix, 'default', 'default')).toBeNull();

    const kept = unique('paver-test');
    await learn(kept, events.slice(0, 60), 0);
    expect(await redis.pttl(learnKey(kept, 'default', 'default'))).toBe(-1);
    await redis.del(learnKey(kept, 'default', 'default'));
  });

  it('a restore gives a scope what was left of its lifetime at its latest copy, and leaves out one idle for longer', async () => {
    const prefix = unique('paver-test');
    const key = learnKey(prefix, 'default', 'default');
    const flag = restoreFlagKey(`${prefix}:aseq:epoch`);
    const topic = unique('autoseq-rules');
    await createTopics([{ topic, partitions: 1, compacted: true }]);
    await sink.connect();
    const { snapshots } = ruleCopier(redis, prefix, sink, topic);
    const hour = 3_600_000;
    const store = await learn(prefix, events, hour);
    snapshots.mark(store.written());
    const copying = Date.now();
    await snapshots.stop();
    const copied = Date.now();
    const learned = await readScope(redis, prefix, 'default', 'default');
    const replay = rulesReplay(topic);

    /** The restore as the service runs it, with the scope TTL given and the clock at `now`. */
    const restoreAt = (ttlMs: number, now: () => number) =>
      restoreRules(redis, prefix, flag, replay, () => true, ttlMs, now);

    // Lost 20 minutes after the copy: it comes back with the 40 minutes it had left.
    await redis.del(key);
    const back = await restoreAt(hour, () => copied + hour / 3);
    expect(back).toMatchObject({ scopes: 1, restored: 1, expired: 0 });
    expect(await readScope(redis, prefix, 'default', 'default')).toEqual(learned);
    const left = await redis.pttl(key);
    expect(left).toBeLessThanOrEqual((2 * hour) / 3);
    expect(left).toBeGreaterThan((2 * hour) / 3 - (copied - copying) - 60_000);

    // Lost after the scope's lifetime ran out: its rules had gone anyway, and stay gone.
    await redis.del(key);
    const late = await restoreAt(hour, () => Date.now() + hour);
    expect(late).toMatchObject({ scopes: 1, restored: 0, expired: 1 });
    expect(await redis.exists(key)).toBe(0);

    // Expiry off: the copy comes back without a TTL, however old.
    const kept = await restoreAt(0, () => Date.now() + 100 * hour);
    expect(kept).toMatchObject({ restored: 1, expired: 0 });
    expect(await redis.pttl(key)).toBe(-1);
    await redis.del(key);
  });
});
