import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { silentLogger } from '../../../../shared/log.js';
import type { Epoch } from '../../../../shared/redis/epoch.js';
import { createStateGuard, type StateGuard } from '../../../../shared/redis/rebuild.js';
import { startTimers, type TimerDeps } from '../../src/adapters/timers.js';

const OWED_MS = 10_000;
const RECONCILE_MS = 10_000;

/** Lets the promise chains a tick started run to their end (only the intervals are fake). */
const settle = () => new Promise<void>((r) => setImmediate(r));
const tick = async (ms = OWED_MS) => {
  await vi.advanceTimersByTimeAsync(ms);
  for (let i = 0; i < 5; i++) await settle();
};

/** What Redis holds of the epoch marker: `lost` as a FLUSHALL would leave it. */
function memoryEpoch() {
  let epoch = 'e1';
  let seen: string | null = null;
  const e: Epoch & { flush(): void } = {
    key: 'test:flows:epoch',
    current: () => seen,
    check: () => {
      const lost = seen !== epoch;
      seen = epoch;
      return Promise.resolve({ lost, epoch });
    },
    flush: () => void (epoch = `${epoch}+`),
  };
  return e;
}

/** A rebuild that ends when the test says so. */
function heldRebuilds() {
  const pending: (() => void)[] = [];
  return {
    rebuild: vi.fn(() => new Promise<void>((r) => pending.push(r))),
    finish: () => pending.splice(0).forEach((r) => r()),
  };
}

function deps(guard: Pick<StateGuard, 'ready'>) {
  const log = silentLogger();
  const d = {
    engine: {
      hasOwed: true,
      settleOwed: vi.fn(() => Promise.resolve()),
      reconcileRegistry: vi.fn(() => Promise.resolve(0)),
    },
    guard,
    feed: { isCaughtUp: () => true },
    registry: { all: () => [] },
    reconcileMs: RECONCILE_MS,
    reconcileMinAgeMs: 1_000,
    onOrphans: vi.fn(),
    log,
  } satisfies TimerDeps;
  return { d, warn: vi.spyOn(log, 'warn') };
}

beforeEach(() => {
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
});
afterEach(() => {
  vi.useRealTimers();
});

describe('flows timers', () => {
  it('neither settle owed writes nor reconcile while the Redis state is being rebuilt', async () => {
    const epoch = memoryEpoch();
    const r = heldRebuilds();
    const guard = createStateGuard({ epoch, log: silentLogger(), rebuild: r.rebuild });
    const { d } = deps(guard);
    const timers = startTimers(d);

    // The first readiness check starts the start-up rebuild; until it ends, the state is not ready.
    await tick();
    await tick();
    expect(r.rebuild).toHaveBeenCalledTimes(1);
    expect(d.engine.settleOwed).not.toHaveBeenCalled();
    expect(d.engine.reconcileRegistry).not.toHaveBeenCalled();

    r.finish();
    await tick();
    expect(d.engine.settleOwed).toHaveBeenCalledTimes(1);
    expect(d.engine.reconcileRegistry).toHaveBeenCalledTimes(1);

    // Redis loses the state: the next ticks find the marker gone, start the rebuild and write nothing meanwhile.
    epoch.flush();
    await tick();
    await tick();
    expect(r.rebuild).toHaveBeenCalledTimes(2);
    expect(r.rebuild).toHaveBeenLastCalledWith('lost', expect.any(Function));
    expect(d.engine.settleOwed).toHaveBeenCalledTimes(1);
    expect(d.engine.reconcileRegistry).toHaveBeenCalledTimes(1);

    r.finish();
    await tick();
    expect(d.engine.settleOwed).toHaveBeenCalledTimes(2);
    expect(d.engine.reconcileRegistry).toHaveBeenCalledTimes(2);
    await timers.stop();
  });

  it('runs one tick at a time and logs a readiness check that fails (no unhandled rejection)', async () => {
    let fail: (err: Error) => void = () => undefined;
    const ready = vi
      .fn(() => Promise.resolve(false))
      .mockImplementationOnce(
        () =>
          new Promise<boolean>((_, reject) => {
            fail = reject;
          }),
      );
    const { d, warn } = deps({ ready });
    const timers = startTimers({ ...d, reconcileMs: 0 });

    // A readiness check that hangs (a Redis slow to answer) is not asked again on top of itself.
    await tick();
    await tick();
    await tick();
    expect(ready).toHaveBeenCalledTimes(1);

    fail(new Error('redis: connection refused'));
    await tick();
    expect(warn).toHaveBeenCalledWith(
      { err: 'redis: connection refused' },
      'setting the flows topics right failed; trying again',
    );
    expect(d.engine.settleOwed).not.toHaveBeenCalled();
    // The failed tick is over: the next one asks again.
    expect(ready).toHaveBeenCalledTimes(2);
    await timers.stop();
  });

  it('refreshes the embeddings one run at a time, and does not wait for a hung one at the stop', async () => {
    const done: (() => void)[] = [];
    const refreshVectors = vi.fn(() => new Promise<void>((r) => done.push(r)));
    const { d } = deps({ ready: () => Promise.resolve(false) });
    const timers = startTimers({ ...d, reconcileMs: 0, refreshVectors });
    // A run that outlasts the interval (many flows to embed, a slow endpoint): not started again on top of it.
    // Before: one more run every 30 s, each asking again for the vectors the first had not set yet.
    await tick(30_000);
    await tick(30_000);
    await tick(30_000);
    expect(refreshVectors).toHaveBeenCalledTimes(1);
    done.splice(0).forEach((r) => r());
    await tick(30_000);
    expect(refreshVectors).toHaveBeenCalledTimes(2);
    // The second run hangs: the stop clears the timer without waiting for it (no client of the stop's is used).
    await timers.stop();
    await tick(30_000);
    expect(refreshVectors).toHaveBeenCalledTimes(2);
  });

  it('stop waits for the owed writes under way', async () => {
    let done: () => void = () => undefined;
    const { d } = deps({ ready: () => Promise.resolve(true) });
    d.engine.settleOwed.mockImplementation(
      () =>
        new Promise<void>((r) => {
          done = r;
        }),
    );
    const timers = startTimers(d);
    await tick();
    expect(d.engine.settleOwed).toHaveBeenCalledTimes(1);

    let stopped = false;
    const stop = timers.stop().then(() => (stopped = true));
    await settle();
    expect(stopped).toBe(false);
    done();
    await stop;
    expect(stopped).toBe(true);
    // Cleared: no tick after the stop.
    await tick();
    expect(d.engine.settleOwed).toHaveBeenCalledTimes(1);
  });
});
