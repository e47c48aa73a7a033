import { afterAll, describe, expect, it } from 'vitest';
import { createEpoch } from '../../../../shared/redis/epoch.js';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { guardedScopeRead, rulesRoute } from '../../src/adapters/http.js';
import { learnKey, readScope } from '../../src/adapters/redis/learn-store.js';
import { fixtureEvents } from '../learn-streams.js';
import { LOW_BAR } from './predict-compare.js';
import { learnBatch } from './rule-copies.js';

const redis = testRedis();
afterAll(async () => {
  await redis.quit();
});

/** A scope with learned rules, the epoch marker as a guard's check leaves it, and a Redis loss to put anywhere. */
async function place() {
  const prefix = unique('paver-test');
  await learnBatch(redis, prefix, fixtureEvents(), LOW_BAR, 0);
  const key = learnKey(prefix, 'default', 'default');
  const raw = await redis.hgetall(key);
  const epoch = createEpoch(redis, `${prefix}:aseq:epoch`);
  await epoch.check();
  const marker = () => ({ key: epoch.key, value: epoch.current() });
  const read = () => readScope(redis, prefix, 'default', 'default', marker());
  // FLUSHALL, for this test's keys only (other tests share the server).
  const lose = () => redis.del(key, epoch.key);
  const restore = () => redis.hset(key, raw);
  return { prefix, epoch, read, lose, restore };
}

describe('GET /rules and a Redis loss between the guard and the read (real Redis)', () => {
  it('the read fails (retriable) instead of answering from the empty Redis', async () => {
    const t = await place();
    expect((await t.read())?.nActive ?? 0).toBeGreaterThan(0);
    await t.lose();
    await expect(t.read()).rejects.toMatchObject({ code: 'STATE_CONTENDED', retriable: true });
  });

  it('the route asks the guard again (which restores) and answers the rules, not an empty list', async () => {
    const t = await place();
    let checks = 0;
    // The guard: its check, then (a loss found) the restore; the first time, Redis is lost right after the check.
    const ensure = async () => {
      if ((await t.epoch.check()).lost) await t.restore();
      if (++checks === 1) await t.lose();
    };
    const route = rulesRoute(
      guardedScopeRead(ensure, () => t.read()),
      LOW_BAR,
    );
    const res = await route.handler({
      method: 'GET',
      path: '/rules',
      params: {},
      query: new URLSearchParams(),
      body: () => Promise.resolve(undefined),
    });
    expect(checks).toBe(2);
    const rules = (res.body as { rules: { state: string }[] }).rules;
    expect(rules.filter((r) => r.state === 'active').length).toBeGreaterThan(0);
  });
});
