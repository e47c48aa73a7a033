import { describe, expect, it } from 'vitest';
import { PaverError } from '../../shared/errors.js';
import { silentLogger } from '../../shared/log.js';
import { createRedisWatch, type RedisRole } from '../../shared/redis/client.js';
import { createRegistryWatch } from '../../shared/registry-watch.js';
import { withRetry } from '../../shared/retry.js';

const transient = () =>
  new PaverError('REDIS_UNAVAILABLE', 'READONLY You cannot write against a read only replica.');
const opts = { attempts: 2, initialMs: 1, maxMs: 1 };

describe('withRetry: failures while a dependency is known down are held, not counted', () => {
  it('a held failure does not use an attempt: the call succeeds after more failures than attempts', async () => {
    let calls = 0;
    let holds = 0;
    const out = await withRetry(
      async () => {
        if (++calls <= 6) throw transient();
        return 'done';
      },
      // The first five failures meet a dependency that is down (held), the sixth one counted.
      { ...opts, hold: async () => ++holds <= 5 },
    );
    expect(out).toBe('done');
    expect(calls).toBe(7);
  });

  it('without a hold, the same failures exhaust the attempts', async () => {
    let calls = 0;
    await expect(
      withRetry(async () => {
        if (++calls <= 6) throw transient();
        return 'done';
      }, opts),
    ).rejects.toThrow(/READONLY/);
    expect(calls).toBe(3);
  });

  it('a hold that ended for a stop does not retry at once: the stop ends the call', async () => {
    let calls = 0;
    let stop = false;
    await expect(
      withRetry(
        async () => {
          calls++;
          throw transient();
        },
        {
          ...opts,
          shouldStop: () => stop,
          hold: async () => {
            stop = true;
            return true;
          },
        },
      ),
    ).rejects.toThrow(/READONLY/);
    expect(calls).toBe(1);
  });

  it('a non-retriable failure is never held', async () => {
    let holds = 0;
    await expect(
      withRetry(
        async () => {
          throw new PaverError('INTERNAL', 'a bug');
        },
        { ...opts, hold: async () => (holds++, true) },
      ),
    ).rejects.toThrow('a bug');
    expect(holds).toBe(0);
  });
});

describe('the Redis watch', () => {
  it('marks the server a replica at the first sign, asks its role until it is not, and stops asking', async () => {
    const answers: RedisRole[] = ['replica', 'replica', 'primary'];
    let asked = 0;
    const watch = createRedisWatch(
      async () => answers[Math.min(asked++, answers.length - 1)]!,
      silentLogger(),
      5,
    );
    expect(watch.down() !== null).toBe(false);
    watch.note('primary');
    expect(watch.down() !== null).toBe(false);
    watch.note('replica');
    watch.note('replica');
    expect(watch.down() !== null).toBe(true);
    await expect.poll(() => watch.down() !== null, { timeout: 5_000 }).toBe(false);
    expect(asked).toBe(3);
    await new Promise((r) => setTimeout(r, 30));
    expect(asked).toBe(3);
    watch.stop();
  });

  it('a role query that fails keeps the mark and is asked again', async () => {
    let asked = 0;
    const watch = createRedisWatch(
      async () => {
        if (++asked < 3) throw new Error('Connection is closed.');
        return 'unknown';
      },
      silentLogger(),
      5,
    );
    watch.note('replica');
    await expect.poll(() => watch.down() !== null, { timeout: 5_000 }).toBe(false);
    expect(asked).toBe(3);
    watch.stop();
  });

  it('a server that stopped answering is watched until it answers; one found to be a replica then stays marked as one', async () => {
    // Each role query waits for the test's answer.
    const queries: { resolve: (r: RedisRole) => void; reject: (e: Error) => void }[] = [];
    const watch = createRedisWatch(
      () => new Promise<RedisRole>((resolve, reject) => queries.push({ resolve, reject })),
      silentLogger(),
      5,
    );
    const query = async (n: number) => {
      await expect.poll(() => queries.length, { timeout: 5_000 }).toBe(n);
      return queries[n - 1]!;
    };
    watch.note('unresponsive');
    expect(watch.down()).toBe('unresponsive');
    (await query(1)).reject(new Error('Command timed out'));
    (await query(2)).resolve('replica');
    await expect.poll(() => watch.down(), { timeout: 5_000 }).toBe('replica');
    // A later timeout does not hide that it is a replica.
    watch.note('unresponsive');
    expect(watch.down()).toBe('replica');
    (await query(3)).resolve('primary');
    await expect.poll(() => watch.down(), { timeout: 5_000 }).toBe(null);
    watch.stop();
  });
});

describe('createRegistryWatch: the schema registry marked down by its outage, up by a probe', () => {
  it('marks it down at a REGISTRY_UNAVAILABLE only, probes until it answers, and stops probing', async () => {
    let probes = 0;
    const watch = createRegistryWatch(
      async () => {
        if (++probes < 3) throw new Error('503');
      },
      silentLogger(),
      5,
    );
    watch.note(new PaverError('REDIS_UNAVAILABLE', 'connection closed'));
    expect(watch.down()).toBeNull();
    watch.note(new PaverError('REGISTRY_UNAVAILABLE', 'schema registry unavailable: 503'));
    watch.note(new PaverError('REGISTRY_UNAVAILABLE', 'schema registry unavailable: again'));
    expect(watch.down()).toBe('schema registry unavailable: 503');
    await expect.poll(() => watch.down(), { timeout: 5_000 }).toBeNull();
    expect(probes).toBe(3);
    await new Promise((r) => setTimeout(r, 30));
    expect(probes).toBe(3);
    watch.stop();
  });
});
