import { describe, expect, it, vi } from 'vitest';
import { createLogger } from '../../../../shared/log.js';
import type { Epoch } from '../../../../shared/redis/epoch.js';
import { ReplayStopped } from '../../../../shared/kafka/replay.js';
import { Rebuilder } from '../../src/adapters/rebuild.js';
import type { CheckpointLog } from '../../src/adapters/kafka/checkpoints.js';
import type { RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { Scope } from '../../src/core/ops.js';

/*
 * The Rebuilder's order of steps over a store of its own (what each Redis step answers is the test's to say):
 * the scopes the publication restore touched are published by the chunk whose rebuild succeeds, whatever failed
 * between the restore and the mark the first time.
 */
describe('Rebuilder: the publication restore and the mark', () => {
  it('a mark that failed after the restore: the next attempt returns the restored scopes to publish', async () => {
    const stale: Scope = { tenant: 'default', agent: 'agent-0' };
    const marks: string[] = [];
    let markFails = 1;
    let restores = 0;
    const store = {
      counted: <T>(p: Promise<T>) => p,
      forgetScopes: () => undefined,
      applyBatch: () => Promise.resolve({ lost: false, changed: [] }),
      rebuiltIn: () => Promise.resolve(marks.at(-1) ?? null),
      markRebuilt: (_p: number, epoch: string) => {
        // Redis failing for a moment (a failover, a restart: when rebuilds run).
        if (markFails-- > 0) return Promise.reject(new Error('Connection is closed.'));
        marks.push(epoch);
        return Promise.resolve();
      },
    } as unknown as RedisDetectorStore;
    const epoch: Epoch = {
      key: 'p:det:epoch',
      current: () => 'e1',
      check: () => Promise.resolve({ lost: false, epoch: 'e1' }),
    };
    const rebuilder = new Rebuilder({
      store,
      epoch,
      checkpoints: { get: () => Promise.resolve(0n) } as unknown as CheckpointLog,
      replay: () => Promise.resolve(),
      restorePublished: () => {
        restores++;
        return Promise.resolve([stale]);
      },
      log: createLogger('detector-test', 'silent'),
      hooks: { started: () => undefined, finished: () => undefined },
    });
    const ctx = { heartbeat: () => Promise.resolve(), isRunning: () => true };

    await expect(rebuilder.ensure(0, 10n, [], ctx)).rejects.toThrow('Connection is closed.');
    expect(marks).toEqual([]);
    // The chunk is retried: the partition is rebuilt again, and the stale candidate's scope is published with it.
    const r = await rebuilder.ensure(0, 10n, [], ctx);
    expect(r).toEqual({ epoch: 'e1', changed: [stale] });
    expect(marks).toEqual(['e1']);
    expect(restores).toBeGreaterThanOrEqual(1);
    // Marked: later chunks trust it, and have nothing more of the restore to publish.
    expect(await rebuilder.ensure(0, 20n, [], ctx)).toEqual({ epoch: 'e1', changed: [] });
  });
});

/**
 * A store, an epoch and a replay of the test's own for the pass over owned partitions: `rebuilt` is the
 * `det:rebuilt` hash, `replays` each replay's (partition, from, end), and a replay of a partition in `blocked`
 * waits for its gate (asking `goOn` as the real one does between fetches).
 */
function ownedFixture(o: {
  owned: number[];
  committed: Record<number, bigint | null>;
  /** What the publication restore waits for. */
  restoreGate?: Promise<void>;
}) {
  const rebuilt = new Map<number, string>();
  const replays: string[] = [];
  const outcomes: string[] = [];
  const published: Scope[][] = [];
  let epochValue = 'e1';
  let checks = 0;
  let rebuiltReads = 0;
  let countedTrips = 0;
  let restores = 0;
  const gates = new Map<number, { open: () => void; opened: Promise<void>; entered: Promise<void> }>();
  const block = (partition: number) => {
    let open!: () => void;
    let enter!: () => void;
    const opened = new Promise<void>((r) => (open = r));
    const entered = new Promise<void>((r) => (enter = r));
    gates.set(partition, { open, opened, entered });
    return { open, entered, enter };
  };
  const entering = new Map<number, () => void>();
  const store = {
    // The epoch check is a round trip on the store's connection: counted as the store's own are.
    counted: <T>(p: Promise<T>) => {
      countedTrips++;
      return p;
    },
    forgetScopes: () => undefined,
    applyBatch: () => Promise.resolve({ lost: false, changed: [] }),
    rebuiltIn: (p: number) => {
      rebuiltReads++;
      return Promise.resolve(rebuilt.get(p) ?? null);
    },
    markRebuilt: (p: number, e: string) => {
      rebuilt.set(p, e);
      return Promise.resolve();
    },
  } as unknown as RedisDetectorStore;
  let seen: string | null = null;
  const epoch: Epoch = {
    key: 'p:det:epoch',
    current: () => seen,
    check: () => {
      checks++;
      const lost = seen !== epochValue;
      seen = epochValue;
      return Promise.resolve({ lost, epoch: epochValue });
    },
  };
  const owned = { now: o.owned as number[] | null };
  const scope: Scope = { tenant: 't', agent: 'quiet' };
  const rebuilder = new Rebuilder({
    store,
    epoch,
    checkpoints: { get: () => Promise.resolve(2n) } as unknown as CheckpointLog,
    replay: async (partition, from, end, each, goOn) => {
      replays.push(`${partition}:${from}-${end}`);
      const gate = gates.get(partition);
      if (gate) {
        entering.get(partition)?.();
        // As readRanges does (every GO_ON_CHECK_MS), a wait for the next fetch ends once `goOn` is false.
        let watch: NodeJS.Timeout | undefined;
        const stopped = new Promise<void>((r) => {
          watch = setInterval(() => {
            if (!goOn()) r();
          }, 5);
        });
        await Promise.race([gate.opened, stopped]).finally(() => clearInterval(watch));
      }
      if (!goOn()) throw new ReplayStopped('tool-calls');
      await each([], 1);
    },
    restorePublished: async () => {
      restores++;
      await o.restoreGate;
      return [scope];
    },
    log: createLogger('detector-test', 'silent'),
    hooks: {
      started: () => undefined,
      finished: (p, outcome, _events, trigger) => outcomes.push(`${p} ${outcome} ${trigger}`),
    },
    owned: {
      owned: () => owned.now,
      committed: (p) => Promise.resolve(o.committed[p] ?? null),
      publish: (scopes) => {
        published.push(scopes);
        return Promise.resolve();
      },
      isRunning: () => true,
    },
  });
  return {
    rebuilder,
    rebuilt,
    replays,
    outcomes,
    published,
    owned,
    scope,
    /** A replay of `partition` waits until `open()`; `entered` resolves once one is waiting. */
    block: (partition: number) => {
      const b = block(partition);
      entering.set(partition, b.enter);
      return { open: b.open, entered: b.entered };
    },
    lose: () => (epochValue = 'e2'),
    counts: () => ({ checks, rebuiltReads }),
    countedTrips: () => countedTrips,
    restores: () => restores,
  };
}

const batchCtx = { heartbeat: () => Promise.resolve(), isRunning: () => true };

describe('Rebuilder: partitions with no batch, rebuilt by a pass over the owned partitions', () => {
  it('rebuilds each owned partition not rebuilt in the epoch up to what its group consumed, and publishes what it changed', async () => {
    const f = ownedFixture({ owned: [0, 1, 2, 3], committed: { 0: 10n, 1: 7n, 3: 5n } });
    f.rebuilt.set(1, 'e1');
    // This process applied partition 3 further than its commit says (the commit after a batch lags behind it).
    f.rebuilder.noteApplied(3, 9n);
    await f.rebuilder.rebuildOwned();
    // 1 is complete in this epoch; 2 was never consumed: its first batch starts its state.
    expect(f.replays).toEqual(['0:2-10', '3:2-9']);
    expect(f.outcomes).toEqual(['0 rebuilt proactive', '3 rebuilt proactive']);
    expect([...f.rebuilt]).toEqual([
      [1, 'e1'],
      [0, 'e1'],
      [3, 'e1'],
    ]);
    // The scopes the publication restore touched, published once.
    expect(f.published).toEqual([[f.scope]]);

    // Nothing changed: the next pass reads the epoch once, and the mark of partition 2 (never consumed) only.
    const before = f.counts();
    await f.rebuilder.rebuildOwned();
    expect(f.counts()).toEqual({ checks: before.checks + 1, rebuiltReads: before.rebuiltReads + 1 });
    // A loss: every owned partition consumed is rebuilt again.
    f.lose();
    await f.rebuilder.rebuildOwned();
    // Every check of the marker, by passes and rebuilds alike, is counted among the store's round trips
    // (paver_detector_redis_round_trips_total): before, none was.
    expect(f.countedTrips()).toBe(f.counts().checks);
    expect(f.countedTrips()).toBeGreaterThan(before.checks);
    expect(f.replays).toEqual(['0:2-10', '3:2-9', '0:2-10', '1:2-7', '3:2-9']);
  });

  it('a batch that finds the epoch changed starts the pass: the other owned partitions are rebuilt without a batch', async () => {
    const f = ownedFixture({ owned: [0, 1], committed: { 0: 4n, 1: 6n } });
    f.rebuilt.set(0, 'e1');
    f.rebuilt.set(1, 'e1');
    await f.rebuilder.exclusive(1, () => f.rebuilder.ensure(1, 6n, [], batchCtx));
    await f.rebuilder.rebuildOwned();
    expect(f.replays).toEqual([]);

    f.lose();
    f.rebuilder.invalidate(1);
    await f.rebuilder.exclusive(1, () => f.rebuilder.ensure(1, 6n, [], batchCtx));
    await f.rebuilder.rebuildOwned();
    expect(f.outcomes).toEqual(['1 rebuilt batch', '0 rebuilt proactive']);
    expect(f.rebuilt.get(0)).toBe('e2');
  });

  it("a batch's rebuild and the pass's, at once, restore the publication maps once and publish its scopes once", async () => {
    let restored!: () => void;
    const restoreGate = new Promise<void>((r) => (restored = r));
    const f = ownedFixture({ owned: [0, 1], committed: { 0: 4n, 1: 6n }, restoreGate });
    let batchChanged: Scope[] = [];
    const batch = f.rebuilder.exclusive(1, async () => {
      batchChanged = (await f.rebuilder.ensure(1, 6n, [], batchCtx)).changed;
    });
    // The batch's ensure started the pass: partition 0's rebuild runs beside partition 1's.
    await vi.waitFor(() => expect(f.replays).toEqual(['1:2-6', '0:2-4']));
    await new Promise((r) => setImmediate(r));
    expect(f.restores()).toBe(1);
    restored();
    await batch;
    await f.rebuilder.rebuildOwned();
    expect(f.restores()).toBe(1);
    expect([...f.rebuilt.keys()].sort()).toEqual([0, 1]);
    expect([...batchChanged, ...f.published.flat()]).toEqual([f.scope]);
  });

  it('a batch and a rebuild of one partition never run at once', async () => {
    const f = ownedFixture({ owned: [0], committed: { 0: 10n } });
    const order: string[] = [];
    // A batch holds partition 0: the pass waits for it.
    let endBatch!: () => void;
    const batch = f.rebuilder.exclusive(0, async () => {
      order.push('batch start');
      await new Promise<void>((r) => (endBatch = r));
      // What it applied: the rebuild that follows replays up to it, past the commit that is still behind.
      f.rebuilder.noteApplied(0, 12n);
      order.push('batch end');
    });
    const gate = f.block(0);
    const pass = f.rebuilder.rebuildOwned();
    await new Promise((r) => setImmediate(r));
    expect(f.replays).toEqual([]);
    endBatch();
    await batch;
    await gate.entered;
    order.push('rebuild replaying');
    // A batch of the partition now waits for the rebuild.
    const next = f.rebuilder.exclusive(0, async () => void order.push('next batch'));
    await new Promise((r) => setImmediate(r));
    gate.open();
    await pass;
    await next;
    expect(order).toEqual(['batch start', 'batch end', 'rebuild replaying', 'next batch']);
    expect(f.replays).toEqual(['0:2-12']);
  });

  it('gives the partition up once a batch waiting for it is told to stop (its group rebalancing): the rebalance does not wait for the replay', async () => {
    const f = ownedFixture({ owned: [0], committed: { 0: 10n } });
    const gate = f.block(0);
    const pass = f.rebuilder.rebuildOwned();
    await gate.entered;
    // A batch of partition 0 waits for the pass's rebuild. kafkajs rejoins only once this batch returns, and
    // `owned` changes only at that rejoin: the batch's heartbeat meeting the rebalance is all that is known.
    let running = true;
    const ctx = { heartbeat: () => Promise.resolve(), isRunning: () => running };
    let ran = false;
    const batch = f.rebuilder.exclusive(0, async () => void (ran = true), ctx);
    running = false;
    await vi.waitFor(() => expect(f.outcomes).toEqual(['0 stopped proactive']));
    await batch;
    expect(ran).toBe(true);
    await pass;
    expect(f.rebuilt.size).toBe(0);
    gate.open();
  });

  it('a batch waiting for the partition and still running leaves the rebuild to its end', async () => {
    const f = ownedFixture({ owned: [0], committed: { 0: 10n } });
    const gate = f.block(0);
    const pass = f.rebuilder.rebuildOwned();
    await gate.entered;
    const batch = f.rebuilder.exclusive(0, () => Promise.resolve(), batchCtx);
    gate.open();
    await pass;
    await batch;
    expect(f.outcomes).toEqual(['0 rebuilt proactive']);
  });

  it('stops when the partition is revoked: not marked, left to its next owner', async () => {
    const f = ownedFixture({ owned: [0], committed: { 0: 10n } });
    const gate = f.block(0);
    const pass = f.rebuilder.rebuildOwned();
    await gate.entered;
    expect(f.rebuilder.isRebuilding()).toBe(true);
    // A rebalance starts: this member owns nothing until it joins again.
    f.owned.now = null;
    gate.open();
    await pass;
    expect(f.outcomes).toEqual(['0 stopped proactive']);
    expect(f.rebuilt.size).toBe(0);
    expect(f.rebuilder.isRebuilding()).toBe(false);
    // Not in the group: a pass does nothing, not even read the epoch.
    const before = f.counts();
    await f.rebuilder.rebuildOwned();
    expect(f.counts()).toEqual(before);
  });

  it('stops at close, and no pass runs after it', async () => {
    const f = ownedFixture({ owned: [0, 1], committed: { 0: 10n, 1: 3n } });
    const gate = f.block(0);
    void f.rebuilder.rebuildOwned();
    await gate.entered;
    const closed = f.rebuilder.close();
    gate.open();
    await closed;
    expect(f.outcomes).toEqual(['0 stopped proactive']);
    await f.rebuilder.rebuildOwned();
    expect(f.replays).toEqual(['0:2-10']);
  });
});
