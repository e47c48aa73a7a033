import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRedis, type Managed } from '../../deploy/local/stack.js';
import { checkEviction } from '../../shared/redis/client.js';
import { createEpoch } from '../../shared/redis/epoch.js';
import type { Logger } from '../../shared/log.js';

/*
 * Redis run as a cache (`maxmemory` with an eviction policy other than `noeviction`) drops Paver's keys to make
 * room, silently: the epoch marker and every count or window with it under `allkeys-*`. No service looked at the
 * policy; now each warns once at start-up (shared/service.ts calls checkEviction after connecting).
 */

let server: Managed & { url: string };
let redis: Redis;
beforeAll(async () => {
  // A private server: the shared one's configuration must not change under other tests.
  server = await startRedis();
  redis = new Redis(server.url, { maxRetriesPerRequest: 2 });
});
afterAll(async () => {
  await redis.quit();
  await server.stop();
});

function recordingLog() {
  const warnings: { fields: unknown; msg: string }[] = [];
  const log = {
    warn: (fields: unknown, msg: string) => warnings.push({ fields, msg }),
    debug: () => undefined,
  } as unknown as Logger;
  return { log, warnings };
}

describe('Redis eviction policy (private redis-server)', () => {
  it('an allkeys policy evicts the epoch marker silently; checkEviction warns about it', async () => {
    await redis.config('SET', 'maxmemory', '0');
    await redis.config('SET', 'maxmemory-policy', 'noeviction');
    const ok = recordingLog();
    expect((await checkEviction(redis, ok.log)).outcome).toBe('ok');
    expect(ok.warnings).toEqual([]);

    // The marker, then more state than Redis may hold under allkeys-lru.
    const epoch = createEpoch(redis, 'evict:epoch');
    const first = await epoch.check();
    const used = Number(/^used_memory:(\d+)/m.exec(await redis.info('memory'))![1]);
    await redis.config('SET', 'maxmemory', String(used + 2_000_000));
    await redis.config('SET', 'maxmemory-policy', 'allkeys-lru');
    const value = 'x'.repeat(10_000);
    for (let i = 0; i < 2_000; i++) await redis.set(`evict:state:${i}`, value);
    // Evicted with the counts it vouches for: no error, no log, only a rebuild at the next check.
    expect(await redis.exists('evict:epoch')).toBe(0);
    expect(await redis.dbsize()).toBeLessThan(2_000);
    expect((await epoch.check()).lost).toBe(true);
    expect(first.lost).toBe(true); // the first check of a process, as always

    const all = recordingLog();
    expect(await checkEviction(redis, all.log)).toMatchObject({ outcome: 'evicts', policy: 'allkeys-lru' });
    expect(all.warnings).toHaveLength(1);
    expect(all.warnings[0]!.msg).toMatch(/noeviction/);

    await redis.config('SET', 'maxmemory-policy', 'volatile-lru');
    const vol = recordingLog();
    expect(await checkEviction(redis, vol.log)).toMatchObject({ outcome: 'evicts', policy: 'volatile-lru' });
    expect(vol.warnings[0]!.msg).toMatch(/TTL/);

    // No limit: nothing is evicted whatever the policy.
    await redis.config('SET', 'maxmemory', '0');
    const none = recordingLog();
    expect((await checkEviction(redis, none.log)).outcome).toBe('ok');
    expect(none.warnings).toEqual([]);
  });
});
