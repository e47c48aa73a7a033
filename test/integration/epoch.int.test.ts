import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { createEpoch, restoreFlagKey } from '../../shared/redis/epoch.js';
import { stack, testRedis, unique } from '../helpers/kafka.js';

describe('epoch marker (real Redis)', () => {
  const redis = testRedis();
  afterAll(() => redis.quit());

  it('reports lost on a first start, steady while the marker stays, lost again once it is gone', async () => {
    const key = unique('paver-test:epoch');
    const a = createEpoch(redis, key);
    const first = await a.check();
    expect(first.lost).toBe(true);
    expect(a.current()).toBe(first.epoch);
    expect(await a.check()).toEqual({ lost: false, epoch: first.epoch });

    // A second instance that starts while the state is there adopts it without a rebuild.
    const b = createEpoch(redis, key);
    expect(await b.check()).toEqual({ lost: false, epoch: first.epoch });

    // State lost: the first to look recreates the marker, the other sees a different epoch; both rebuild.
    await redis.del(key);
    const again = await a.check();
    expect(again.lost).toBe(true);
    expect(again.epoch).not.toBe(first.epoch);
    expect(await b.check()).toEqual({ lost: true, epoch: again.epoch });
    expect(await b.check()).toEqual({ lost: false, epoch: again.epoch });
    await redis.del(key);
  });

  it('with a restore flag: the check that creates the marker sets the flag in the same step, and only that one', async () => {
    const key = unique('paver-test-epoch');
    const flag = restoreFlagKey(key);
    const [a, b] = [createEpoch(redis, key, flag), createEpoch(redis, key, flag)];
    expect((await a.check()).lost).toBe(true);
    expect(await redis.exists(flag)).toBe(1);
    // Another instance starting meanwhile finds the marker (nothing lost as far as it knows), and the flag: its
    // start-up restore runs too (idempotent), which it would skip without the flag.
    expect((await b.check()).lost).toBe(false);
    expect(await redis.exists(flag)).toBe(1);
    await redis.del(flag); // the restore done
    expect((await a.check()).lost).toBe(false);
    expect(await redis.exists(flag)).toBe(0);
    await redis.del(key); // Redis lost its state
    expect((await b.check()).lost).toBe(true);
    expect(await redis.exists(flag)).toBe(1);
    expect((await a.check()).lost).toBe(true); // replaced under it
    await redis.del(key, flag);
  });

  it('the restore flag is in the marker hash slot and under the key prefix: an ACL user limited to the prefix can set it', async () => {
    const prefix = unique('acl-prefix');
    const key = `${prefix}:seq:epoch`;
    const flag = restoreFlagKey(key);
    // Its hash tag (the first {…}) is the marker's whole name, which holds no braces: the marker's slot.
    expect(/\{([^}]*)\}/.exec(flag)?.[1]).toBe(key);
    const user = unique('paver-acl');
    await redis.call('ACL', 'SETUSER', user, 'on', '>secret', `~${prefix}:*`, '+@all');
    const limited = new Redis(stack().redisUrl, { username: user, password: 'secret' });
    try {
      expect((await createEpoch(limited, key, flag).check()).lost).toBe(true);
      expect(await redis.exists(flag)).toBe(1);
    } finally {
      limited.disconnect();
      await redis.call('ACL', 'DELUSER', user);
      await redis.del(key, flag);
    }
  });
});
