import { describe, expect, it } from 'vitest';
import type { Epoch, EpochCheck } from '../../shared/redis/epoch.js';
import { createLogger } from '../../shared/log.js';
import {
  createStateGuard,
  RebuildStopped,
  whileGoingOn,
  type RebuildReason,
} from '../../shared/redis/rebuild.js';

/** An epoch whose marker the test removes at will (the real one is covered against Redis in epoch.int.test.ts). */
function fakeEpoch() {
  let marker: string | null = null;
  let seen: string | null = null;
  let n = 0;
  const epoch: Epoch = {
    key: 'k',
    current: () => seen,
    check(): Promise<EpochCheck> {
      const created = marker === null;
      if (created) marker = `e${++n}`;
      const lost = created || (seen !== null && seen !== marker);
      seen = marker;
      return Promise.resolve({ lost, epoch: marker! });
    },
  };
  return { epoch, lose: () => (marker = null) };
}

const log = createLogger('test', 'silent');

describe('state guard', () => {
  it('rebuilds on the first use, again only after a loss, and readiness says false until rebuilt', async () => {
    const e = fakeEpoch();
    const reasons: RebuildReason[] = [];
    let release: (() => void) | null = null;
    const g = createStateGuard({
      epoch: e.epoch,
      log,
      rebuild: (r) => {
        reasons.push(r);
        return r === 'lost' ? new Promise<void>((ok) => (release = ok)) : Promise.resolve();
      },
    });
    await g.ensure();
    await g.ensure();
    expect(reasons).toEqual(['start']);
    expect(await g.ready()).toBe(true);

    e.lose();
    // The probe itself finds the loss and starts the rebuild; every user waits for it.
    expect(await g.ready()).toBe(false);
    expect(g.rebuilding()).toBe(true);
    let passed = false;
    const user = g.ensure().then(() => (passed = true));
    await Promise.resolve();
    expect(passed).toBe(false);
    expect(await g.ready()).toBe(false);
    release!();
    await user;
    expect(reasons).toEqual(['start', 'lost']);
    expect(await g.ready()).toBe(true);
  });

  it('a failed rebuild stays owed although the marker is back, and the next use retries it', async () => {
    const e = fakeEpoch();
    let fail = true;
    const outcomes: string[] = [];
    const g = createStateGuard({
      epoch: e.epoch,
      log,
      rebuild: () => (fail ? Promise.reject(new Error('topic not read yet')) : Promise.resolve()),
      onRebuild: (r, o) => outcomes.push(`${r}:${o}`),
    });
    await expect(g.ensure()).rejects.toThrow('topic not read yet');
    expect(await g.ready()).toBe(false);
    fail = false;
    await g.ensure();
    expect(await g.ready()).toBe(true);
    expect(outcomes[0]).toBe('start:failed');
    expect(outcomes.at(-1)).toBe('start:ok');
  });

  it('callers that met the loss in one check all wait for the rebuild (none passes before it ends)', async () => {
    const e = fakeEpoch();
    let release: (() => void) | null = null;
    const g = createStateGuard({
      epoch: e.epoch,
      log,
      rebuild: (r) => (r === 'lost' ? new Promise<void>((ok) => (release = ok)) : Promise.resolve()),
    });
    await g.ensure();
    e.lose();
    // Reads arriving together after the loss: they share one check, and the first to resume starts the rebuild.
    const passed: number[] = [];
    const users = [0, 1, 2, 3].map((i) => g.ensure().then(() => passed.push(i)));
    const probe = g.ready();
    for (let i = 0; i < 20; i++) await Promise.resolve();
    expect(g.rebuilding()).toBe(true);
    expect(passed).toEqual([]);
    expect(await probe).toBe(false);
    release!();
    await Promise.all(users);
    expect(passed.sort()).toEqual([0, 1, 2, 3]);
  });

  it('a stop gives the running rebuild up: its waiters end with SHUTTING_DOWN, it stays owed, and none starts again', async () => {
    const e = fakeEpoch();
    let running = true;
    const outcomes: string[] = [];
    const reasons: RebuildReason[] = [];
    const g = createStateGuard({
      epoch: e.epoch,
      log,
      goOn: () => running,
      // A long restore that ends only when told to stop (as a replay given `goOn` does).
      rebuild: (r, goOn) => {
        reasons.push(r);
        if (r === 'start') return Promise.resolve();
        return whileGoingOn(goOn, new Promise<void>(() => undefined));
      },
      onRebuild: (r, o) => outcomes.push(`${r}:${o}`),
    });
    await g.ensure();
    e.lose();
    const batch = g.ensure();
    const other = g.ensure();
    for (let i = 0; i < 20; i++) await Promise.resolve();
    expect(g.rebuilding()).toBe(true);
    running = false;
    await expect(batch).rejects.toBeInstanceOf(RebuildStopped);
    await expect(other).rejects.toMatchObject({ code: 'SHUTTING_DOWN' });
    expect(outcomes).toEqual(['start:ok', 'lost:stopped']);
    // Still owed, and no probe or caller starts it again while the service stops.
    expect(await g.ready()).toBe(false);
    await expect(g.ensure()).rejects.toMatchObject({ code: 'SHUTTING_DOWN' });
    expect(g.rebuilding()).toBe(false);
    expect(reasons).toEqual(['start', 'lost']);
  });

  it('any failure of a rebuild once the stop began is a stop, not a failure', async () => {
    const e = fakeEpoch();
    let running = true;
    const outcomes: string[] = [];
    const g = createStateGuard({
      epoch: e.epoch,
      log,
      goOn: () => running,
      rebuild: () => {
        running = false;
        return Promise.reject(new Error('Connection is closed.'));
      },
      onRebuild: (r, o) => outcomes.push(`${r}:${o}`),
    });
    await expect(g.ensure()).rejects.toMatchObject({ code: 'SHUTTING_DOWN' });
    expect(outcomes).toEqual(['start:stopped']);
  });
});
