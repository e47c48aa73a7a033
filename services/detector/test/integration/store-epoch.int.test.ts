import { afterAll, describe, expect, it } from 'vitest';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { detectorGlobalKeys, detectorKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS, stateFingerprint } from '../../src/core/params.js';

const redis = testRedis();
afterAll(() => redis.disconnect());

const scope = { tenant: 'acme', agent: 'a1' };
const call = (task: string, step: number, ts: number, offset: number, partition = 0): DetectorOp => ({
  kind: 'call',
  scope,
  task,
  eventId: `${task}-${step}`,
  ts,
  step,
  tool: `tool${step}`,
  cost: 10_000,
  partition,
  offset: String(offset),
});
const done = (task: string, ts: number, offset: number, partition = 0): DetectorOp => ({
  kind: 'done',
  scope,
  task,
  eventId: `${task}-done`,
  ts,
  partition,
  offset: String(offset),
});

/** The Redis side of a Redis loss (services/detector/README.md, "Redis loss"), on real Redis. */
describe('detector store: epochs and checkpoints', () => {
  it('a scope of an earlier epoch while the marker holds is stale, not a loss; clearStale brings it under the epoch', async () => {
    const prefix = unique('det-stale');
    const g = detectorGlobalKeys(prefix);
    const k = detectorKeys(prefix, scope);
    const store = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix);
    await redis.set(g.epoch, 'E1');
    expect((await store.applyBatch([call('t1', 0, 1000, 0)], { epoch: 'E1' })).lost).toBe(false);
    // A new epoch without a loss (an evicted marker, retireEpoch), and no rebuild reached this scope.
    await redis.set(g.epoch, 'E2');
    const refused = await store.applyBatch([call('t2', 0, 5000, 7)], { epoch: 'E2' });
    expect(refused).toMatchObject({ lost: true, markerLost: false, stale: [scope], applied: 0 });
    expect(await redis.hget(k.meta, 'epoch')).toBe('E1');
    expect(await store.clearStale([scope], 'E2')).toBe(true);
    expect(await redis.hget(k.meta, 'epoch')).toBe('E2');
    expect(await redis.hexists(k.events, 't1')).toBe(0);
    expect(await store.applyBatch([call('t2', 0, 5000, 7)], { epoch: 'E2' })).toMatchObject({
      lost: false,
      stale: [],
      applied: 1,
    });
    // The marker gone: a loss, whatever the scopes say, and the clearing says so too.
    await redis.del(g.epoch);
    expect(await store.applyBatch([call('t2', 1, 5001, 8)], { epoch: 'E2' })).toMatchObject({
      lost: true,
      markerLost: true,
    });
    expect(await store.clearStale([scope], 'E2')).toBe(false);
  });

  it('a batch meeting an emptied Redis, or state of another epoch, is reported lost; rebuild mode clears it', async () => {
    const prefix = unique('det-epoch');
    const g = detectorGlobalKeys(prefix);
    const store = new RedisDetectorStore(redis, { ...DEFAULT_PARAMS, lookback: 2 }, prefix);
    await redis.set(g.epoch, 'E1');
    const ok = await store.applyBatch([call('t1', 0, 1000, 0), call('t1', 1, 1001, 1)], { epoch: 'E1' });
    expect(ok.lost).toBe(false);
    expect(ok.applied).toBe(2);

    // The marker is gone (FLUSHALL): the batch's own round trip says so.
    await redis.del(g.epoch);
    expect((await store.applyBatch([call('t1', 2, 1002, 2)], { epoch: 'E1' })).lost).toBe(true);

    // A new epoch: state written under E1 is refused in normal mode, nothing written...
    await redis.set(g.epoch, 'E2');
    const meta = detectorKeys(prefix, scope).meta;
    const before = await redis.hgetall(meta);
    expect((await store.applyBatch([call('t1', 3, 1003, 3)], { epoch: 'E2' })).lost).toBe(true);
    expect(await redis.hgetall(meta)).toEqual(before);

    // ...and cleared in rebuild mode, after which the scope holds only what the rebuild applies.
    const r = await store.applyBatch([call('t2', 0, 2000, 10)], { epoch: 'E2', mode: 'r' });
    expect(r.lost).toBe(false);
    expect(r.applied).toBe(1);
    expect(await redis.hget(meta, 'epoch')).toBe('E2');
    expect(await redis.hexists(`${detectorKeys(prefix, scope).events}`, 't1')).toBe(0);
    // t1's events were cleared with the old epoch: a late redelivery of one opens t1 anew.
    expect((await store.applyBatch([call('t1', 0, 2001, 0)], { epoch: 'E2' })).applied).toBe(1);
  });

  it('the checkpoint is the first offset of the oldest open task or window record, per partition', async () => {
    const prefix = unique('det-ckpt');
    const store = new RedisDetectorStore(redis, { ...DEFAULT_PARAMS, lookback: 2 }, prefix);
    await redis.set(detectorGlobalKeys(prefix).epoch, 'E');
    const apply = (ops: DetectorOp[]) => store.applyBatch(ops, { epoch: 'E' });
    // Nothing held yet: the next offset to read.
    expect(await store.checkpoint(0, 5n, 'E')).toBe(5n);
    await apply([call('a', 0, 100, 5), call('b', 0, 101, 6), call('a', 1, 102, 7), done('a', 103, 8)]);
    await apply([call('x', 0, 100, 40, 1)]);
    expect(await store.checkpoint(0, 9n, 'E')).toBe(5n); // a (window) starts at 5
    expect(await store.checkpoint(1, 41n, 'E')).toBe(40n); // partition 1 on its own
    await apply([done('b', 104, 9), call('c', 0, 105, 10), done('c', 106, 11)]);
    // The window holds 2 records (b, c): a left it, so a replay may start at b's first event.
    expect(await store.checkpoint(0, 12n, 'E')).toBe(6n);
    await apply([call('d', 0, 107, 12), done('d', 108, 13)]);
    expect(await store.checkpoint(0, 14n, 'E')).toBe(10n);
    // The state went after the last batch (a FLUSHALL): an empty state is not "nothing open". A checkpoint
    // of `next` there would make the rebuild skip the window; there is none until the state is rebuilt.
    await redis.eval(
      "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0",
      0,
      `${prefix}:*`,
    );
    expect(await store.checkpoint(0, 14n, 'E')).toBeNull();
    await redis.set(detectorGlobalKeys(prefix).epoch, 'E2');
    expect(await store.checkpoint(0, 14n, 'E')).toBeNull();
  });

  it('a task open again under the id of a record leaving the window keeps its start in the checkpoint', async () => {
    const prefix = unique('det-ckpt-reopen');
    // Task ids forgotten 10 ms (of event time) after they complete: one can open again while its record is held.
    const params = { ...DEFAULT_PARAMS, lookback: 1, taskIdleMs: 10, doneRetentionMs: 10 };
    const store = new RedisDetectorStore(redis, params, prefix);
    await redis.set(detectorGlobalKeys(prefix).epoch, 'E');
    const apply = (ops: DetectorOp[]) => store.applyBatch(ops, { epoch: 'E' });
    await apply([call('t', 0, 100, 0), done('t', 101, 1), call('x', 0, 200, 2)]);
    // t again (its id forgotten): it opens at offset 3, while its first run's record is still the window's.
    expect((await apply([call('t', 0, 205, 3)])).applied).toBe(1);
    // x completes and pushes t's record out; y's completion pushes x's.
    await apply([done('x', 206, 4), call('y', 0, 207, 5), done('y', 208, 6)]);
    expect(await redis.hget(detectorKeys(prefix, scope).events, 't')).not.toBeNull();
    // t is open since offset 3: a replay from any later offset would rebuild it without its first event.
    const checkpoint = await store.checkpoint(0, 7n, 'E');
    expect(checkpoint).not.toBeNull();
    expect(checkpoint!).toBeLessThanOrEqual(3n);
  });

  it('state of an older layout with the same parameters is lost, not misread: refused, then cleared by a rebuild', async () => {
    const prefix = unique('det-layout');
    const params = { ...DEFAULT_PARAMS, lookback: 2 };
    const store = new RedisDetectorStore(redis, params, prefix);
    await redis.set(detectorGlobalKeys(prefix).epoch, 'E');
    const k = detectorKeys(prefix, scope);
    // What a v3 detector left: the same parameters under layout v3, and task ids in sorted-set buckets.
    const v3 = stateFingerprint(params).replace(/\|[^|]*$/, '|v3');
    await redis.hset(k.meta, 'cfg', v3, 'epoch', 'E', 'maxTs', '1000', 'clock:0', '1000');
    await redis.zadd(`${k.done}:0:127`, 1000, 'old-task');
    await redis.hset(k.support, 'tool0\u001ftool1', '1,10000');
    // Normal mode: refused as an older layout's state (the service then starts a new epoch, so that every
    // partition is rebuilt: retireEpoch), nothing written.
    expect(await store.applyBatch([call('t1', 0, 1001, 0)], { epoch: 'E' })).toMatchObject({
      lost: true,
      olderLayout: true,
    });
    expect(await redis.hget(k.meta, 'cfg')).toBe(v3);
    // The epoch ends only if the marker still names it.
    expect(await store.retireEpoch('other')).toBe(false);
    expect(await redis.get(detectorGlobalKeys(prefix).epoch)).toBe('E');
    expect(await store.retireEpoch('E')).toBe(true);
    expect(await redis.get(detectorGlobalKeys(prefix).epoch)).toBeNull();
    await redis.set(detectorGlobalKeys(prefix).epoch, 'E');
    // Rebuild mode clears every key of the old layout, then applies under the current one.
    const r = await store.applyBatch([call('t1', 0, 1001, 0), done('t1', 1002, 1)], {
      epoch: 'E',
      mode: 'r',
    });
    expect(r).toMatchObject({ lost: false, applied: 2, completed: 1 });
    expect(await redis.hget(k.meta, 'cfg')).toBe(stateFingerprint(params));
    expect(await redis.exists(`${k.done}:0:127`)).toBe(0);
    expect(await redis.hexists(k.support, 'tool0\u001ftool1')).toBe(0);
    // State of a newer layout (a newer version wrote it) is refused in both modes, never cleared: this instance is
    // the older one of a rolling update or a rollback, and stops.
    const newer = stateFingerprint(params).replace(/\|[^|]*$/, '|v99');
    await redis.hset(k.meta, 'cfg', newer);
    for (const mode of ['n', 'r'] as const)
      await expect(store.applyBatch([call('t3', 0, 1004, 3)], { epoch: 'E', mode })).rejects.toThrow(
        /newer version of the detector/,
      );
    expect(await redis.hget(k.meta, 'cfg')).toBe(newer);
    expect(await redis.hget(k.meta, 'epoch')).toBe('E');
    await redis.hset(k.meta, 'cfg', stateFingerprint(params));
    // Parameters that differ are still refused outright (exit 1), never cleared.
    const other = new RedisDetectorStore(redis, { ...params, lookback: 3 }, prefix);
    await expect(other.applyBatch([call('t2', 0, 1003, 2)], { epoch: 'E', mode: 'r' })).rejects.toThrow(
      /other parameters/,
    );
  });
});
