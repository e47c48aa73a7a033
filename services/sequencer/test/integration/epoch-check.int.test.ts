import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createEpoch } from '../../../../shared/redis/epoch.js';
import { cheapEpochCheck } from '../../src/adapters/epoch.js';

let redis: Redis;
beforeAll(() => {
  redis = testRedis();
});
afterAll(() => redis.disconnect());

/** Calls of one command the server has answered. */
async function calls(command: string): Promise<number> {
  const m = new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(await redis.info('commandstats'));
  return Number(m?.[1] ?? 0);
}

describe('cheap epoch check (real Redis)', () => {
  it('an unchanged marker costs one GET; a marker removed or replaced is a loss, every time', async () => {
    const key = `${unique('epoch')}:seq:epoch`;
    const epoch = cheapEpochCheck(redis, createEpoch(redis, key));
    expect((await epoch.check()).lost).toBe(true); // first check of a process: no marker yet
    const seen = epoch.current();

    const [sets, execs] = [await calls('set'), await calls('exec')];
    for (let i = 0; i < 5; i++) expect(await epoch.check()).toEqual({ lost: false, epoch: seen });
    expect([await calls('set'), await calls('exec')]).toEqual([sets, execs]);

    await redis.del(key); // FLUSHALL, or a restart without persistence
    expect((await epoch.check()).lost).toBe(true);
    expect(epoch.current()).not.toBe(seen);
    expect((await epoch.check()).lost).toBe(false);

    await redis.set(key, 'recreated-by-another-instance');
    expect((await epoch.check()).lost).toBe(true);
    expect(epoch.current()).toBe('recreated-by-another-instance');
    expect((await epoch.check()).lost).toBe(false);
  });
});
