import { describe, expect, it } from 'vitest';
import { PaverError } from '../../shared/errors.js';
import { silentLogger } from '../../shared/log.js';
import { createReplicaWatch, type RedisRole } from '../../shared/redis/client.js';
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

describe('the replica watch', () => {
  it('marks the server a replica at the first sign, asks its role until it is not, and stops asking', async () => {
    const answers: RedisRole[] = ['replica', 'replica', 'primary'];
    let asked = 0;
    const watch = createReplicaWatch(
      async () => answers[Math.min(asked++, answers.length - 1)]!,
      silentLogger(),
      5,
    );
    expect(watch.isReplica()).toBe(false);
    watch.note('primary');
    expect(watch.isReplica()).toBe(false);
    watch.note('replica');
    watch.note('replica');
    expect(watch.isReplica()).toBe(true);
    await expect.poll(() => watch.isReplica(), { timeout: 5_000 }).toBe(false);
    expect(asked).toBe(3);
    await new Promise((r) => setTimeout(r, 30));
    expect(asked).toBe(3);
    watch.stop();
  });

  it('a role query that fails keeps the mark and is asked again', async () => {
    let asked = 0;
    const watch = createReplicaWatch(
      async () => {
        if (++asked < 3) throw new Error('Connection is closed.');
        return 'unknown';
      },
      silentLogger(),
      5,
    );
    watch.note('replica');
    await expect.poll(() => watch.isReplica(), { timeout: 5_000 }).toBe(false);
    expect(asked).toBe(3);
    watch.stop();
  });
});
