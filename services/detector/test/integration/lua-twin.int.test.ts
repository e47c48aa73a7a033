import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import {
  detectorGlobalKeys,
  detectorKeys,
  RedisDetectorStore,
  type BatchOutcome,
} from '../../src/adapters/redis/store.js';
import { liveCandidates } from '../../src/core/detect.js';
import { toOp, type DetectorOp, type Scope } from '../../src/core/ops.js';
import { DEFAULT_PARAMS, stateFingerprint, type DetectorParams } from '../../src/core/params.js';
import { DetectorState, emptyResult } from '../../src/core/state.js';
import type { GramStat } from '../../src/core/select.js';
import { makeLogs, rng } from '../reference/partition-logs.js';

/** A batch's counters as core/state.ts counts them (without what only the store reports), and whether it changed. */
function countsOf(out: BatchOutcome) {
  const { changed, lost: _l, owed: _o, stale: _s, markerLost: _m, olderLayout: _ol, ...counts } = out;
  return { counts, changed: changed.length > 0 };
}

const redis = testRedis();
afterAll(() => redis.disconnect());

const sortStats = (xs: GramStat[]) => [...xs].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
const sortRecords = (xs: { tools: string[]; terms: string[] | null }[]) =>
  xs.map((x) => JSON.stringify(x)).sort();

/** The scope's window as the store holds it, checked equal to core/state.ts's: its stats and records. */
async function expectSameWindow(store: RedisDetectorStore, state: DetectorState, scope: Scope) {
  const snap = await store.snapshot(scope);
  expect(sortStats(snap.stats)).toEqual(sortStats(state.frequentStats(scope)));
  expect(sortRecords(snap.records)).toEqual(sortRecords(state.windowRecords(scope)));
  return snap;
}

/** `ops` applied to both in chunks of 1..maxChunk (drawn from `r`), each chunk's counters checked equal. */
async function applyInChunks(
  state: DetectorState,
  store: RedisDetectorStore,
  ops: DetectorOp[],
  r: () => number,
  maxChunk: number,
) {
  for (let i = 0; i < ops.length;) {
    const chunk = ops.slice(i, i + 1 + Math.floor(r() * maxChunk));
    i += chunk.length;
    const { changed, ...mem } = state.applyAll(chunk);
    const { counts: lua, changed: luaChanged } = countsOf(await store.applyBatch(chunk));
    expect(lua).toEqual(mem);
    expect(luaChanged).toBe(changed);
  }
}

/**
 * The Lua twin (apply-11.lua, snapshot-3.lua) against core/state.ts on real Redis (issue 11 item 5):
 * random operation streams over several partitions and scopes, in random chunk sizes, give equal counters
 * after every chunk and equal counts, windows and candidates at the end.
 */
describe('apply-11.lua = core/state.ts', () => {
  it('a user_message the task kept, delivered again, is a duplicate in both (it was counted applied twice)', async () => {
    const params: DetectorParams = { ...DEFAULT_PARAMS };
    const state = new DetectorState(params);
    const prefix = unique('twin-msg');
    const store = new RedisDetectorStore(redis, params, prefix);
    await redis.set(detectorGlobalKeys(prefix).epoch, 'e1');
    const scope = { tenant: 't', agent: 'a' };
    const msg: DetectorOp = {
      kind: 'msg',
      scope,
      task: 't1',
      eventId: 'm1',
      ts: 1000,
      terms: ['invoice'],
      partition: 0,
      offset: '0',
    };
    const call: DetectorOp = {
      kind: 'call',
      scope,
      task: 't1',
      eventId: 'c1',
      ts: 1001,
      step: 0,
      tool: 'a',
      cost: 10_000,
      partition: 0,
      offset: '1',
    };
    const later: DetectorOp = { ...msg, eventId: 'm2', ts: 1002, offset: '2' };
    let last: Record<string, unknown> = {};
    for (const chunk of [
      [msg, call],
      [msg, call, later],
    ]) {
      const { changed: _m, ...mem } = state.applyAll(chunk);
      const { counts: lua } = countsOf(await store.applyBatch(chunk, { epoch: 'e1' }));
      expect(lua).toEqual(mem);
      last = mem;
    }
    // The kept message and the call again: duplicates; a later message (not kept) is applied.
    expect(last).toMatchObject({ applied: 1, ignored: 2, ignoredBy: { duplicate: 2 } });
  });

  it('an event after its task’s last event, arriving after the idle close, is late in both (it was a duplicate); one at or before that event a duplicate', async () => {
    const params: DetectorParams = { ...DEFAULT_PARAMS };
    const state = new DetectorState(params);
    const prefix = unique('twin-idle');
    const store = new RedisDetectorStore(redis, params, prefix);
    await redis.set(detectorGlobalKeys(prefix).epoch, 'e1');
    const scope = { tenant: 't', agent: 'a' };
    const idle = params.taskIdleMs;
    let offset = 0;
    const call = (task: string, eventId: string, ts: number): DetectorOp => ({
      kind: 'call',
      scope,
      task,
      eventId,
      ts,
      step: 0,
      tool: 'x',
      cost: 10_000,
      partition: 0,
      offset: String(offset++),
    });
    const chunks: DetectorOp[][] = [
      [call('t1', 'a1', 1_000), call('t2', 'b1', 1_000)],
      // t1 closes idle at 1000 + idle, by its own next event and (t2) by another task's.
      [call('t1', 'a2', 1_000 + idle)],
      [call('t3', 'c1', 1_000 + idle), call('t2', 'b2', 1_000 + idle), call('t2', 'b1', 1_000)],
      // Between t1's last event and its close: never seen (it was a duplicate up to one ms before the close).
      [call('t1', 'a3', 1_000 + idle - 1)],
      [call('t1', 'a4', 1_001), call('t1', 'a5', 1_000 + idle / 2)],
      // At or before its last event: a redelivery, or what the task cannot tell from one.
      [call('t1', 'a1', 1_000), call('t1', 'a0', 999)],
    ];
    const seen = [];
    for (const chunk of chunks) {
      const { changed: _m, ...mem } = state.applyAll(chunk);
      const { counts: lua } = countsOf(await store.applyBatch(chunk, { epoch: 'e1' }));
      expect(lua).toEqual(mem);
      seen.push(mem.ignoredBy);
    }
    expect(seen.map((b) => [b.late, b.duplicate])).toEqual([
      [0, 0],
      [1, 0],
      [1, 1],
      [1, 0],
      [2, 0],
      [0, 2],
    ]);
  });

  it('an idle-closed task’s id is remembered the retention after its close in both, not after its last event', async () => {
    const params: DetectorParams = { ...DEFAULT_PARAMS, taskIdleMs: 100, doneRetentionMs: 100 };
    const scope = { tenant: 't', agent: 'a' };
    const call = (task: string, eventId: string, ts: number): DetectorOp => ({
      kind: 'call',
      scope,
      task,
      eventId,
      ts,
      step: 0,
      tool: 'x',
      cost: 10_000,
      partition: 0,
    });
    const seen: string[] = [];
    for (const clock of [200, 201]) {
      const state = new DetectorState(params);
      const store = new RedisDetectorStore(redis, params, unique('twin-retain'));
      // t1 closes idle at 100 (by t2's event); its event at 150 is not idle on the clock: remembered, it is late;
      // forgotten, it opens t1 again.
      const chunks = [
        [call('t1', 'e1', 0), call('t2', 'f1', 100)],
        [call('t2', 'f2', clock)],
        [call('t1', 'e2', 150)],
      ];
      let last = emptyResult();
      for (const chunk of chunks) {
        last = state.applyAll(chunk);
        const { changed: _m, ...mem } = last;
        const { counts: lua } = countsOf(await store.applyBatch(chunk));
        expect(lua).toEqual(mem);
      }
      seen.push(last.ignoredBy.late === 1 ? 'late' : last.applied === 1 ? 'applied' : 'other');
      await expectSameWindow(store, state, scope);
    }
    expect(seen).toEqual(['late', 'applied']);
  });

  it('random streams in random chunks give equal counters, snapshots and candidates', async () => {
    let chunks = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          seed: fc.integer(),
          schedule: fc.integer(),
          partitions: fc.integer({ min: 1, max: 4 }),
          tasks: fc.integer({ min: 5, max: 40 }),
          idleMs: fc.integer({ min: 15, max: 80 }),
          lookback: fc.integer({ min: 3, max: 20 }),
          windowMs: fc.option(fc.integer({ min: 50, max: 2_000 }), { nil: null }),
          maxTaskEvents: fc.integer({ min: 2, max: 8 }),
          doneRetentionMs: fc.integer({ min: 50, max: 5_000 }),
          // Some streams with events on another partition than their task's: a producer keying by something
          // other than session_id, or a task spanning sessions.
          misroute: fc.constantFrom(0, 0, 0.1),
          // Some with tools of one task only: their names leave the dictionary with their records.
          freshTools: fc.constantFrom(0, 0, 0.5),
        }),
        async (g) => {
          const params: DetectorParams = {
            ...DEFAULT_PARAMS,
            minLength: 2,
            maxLength: 5,
            minOccurrences: 2,
            maxCandidates: 4,
            lookback: g.lookback,
            windowMs: g.windowMs,
            taskIdleMs: g.idleMs,
            maxTaskEvents: g.maxTaskEvents,
            doneRetentionMs: g.doneRetentionMs,
          };
          const logs = makeLogs(g.seed, g.partitions, g.tasks, g.idleMs, g.freshTools);
          const r = rng(g.schedule);
          // One arrival order across partitions, then cut into chunks as the runner would hand them over.
          const pos = logs.map(() => 0);
          const offsets = logs.map(() => 0);
          const ops: DetectorOp[] = [];
          for (;;) {
            const open = logs.map((_, p) => p).filter((p) => pos[p]! < logs[p]!.length);
            if (open.length === 0) break;
            const p = open[Math.floor(r() * open.length)]!;
            const q = g.partitions > 1 && r() < g.misroute ? (p + 1) % g.partitions : p;
            const op = toOp(logs[p]![pos[p]!]!, true, q, String(offsets[q]!++));
            pos[p]!++;
            if (op) ops.push(op);
          }
          const state = new DetectorState(params);
          const prefix = unique('twin');
          const store = new RedisDetectorStore(redis, params, prefix);
          const epoch = 'e1';
          await redis.set(detectorGlobalKeys(prefix).epoch, epoch);
          for (let i = 0; i < ops.length;) {
            // Mostly live-sized chunks; some of 64+ ops, which apply-11.lua reads support counts for in bulk.
            const size = r() < 0.2 ? 64 + Math.floor(r() * 64) : 1 + Math.floor(r() * 12);
            const chunk = ops.slice(i, i + size);
            i += chunk.length;
            const mem = state.applyAll(chunk);
            // With an epoch, as the service runs it (the marker is read around the scripts).
            const lua = await store.applyBatch(chunk, { epoch });
            const { changed: _m, ...memCounts } = mem;
            const { counts: luaCounts, changed: luaChanged } = countsOf(lua);
            expect(lua.lost).toBe(false);
            expect(luaCounts).toEqual(memCounts);
            expect(luaChanged).toBe(mem.changed);
            chunks++;
          }
          for (const agent of ['agent0', 'agent1']) {
            const scope = { tenant: 'acme', agent };
            const snap = await store.snapshot(scope);
            expect(sortStats(snap.stats)).toEqual(sortStats(state.frequentStats(scope)));
            expect(sortRecords(snap.records)).toEqual(sortRecords(state.windowRecords(scope)));
            expect(liveCandidates(snap.stats, params, snap.records)).toEqual(
              liveCandidates(state.frequentStats(scope), params, state.windowRecords(scope)),
            );
          }
        },
      ),
      { numRuns: 120 },
    );
    expect(chunks).toBeGreaterThan(500);
    if (process.env.PAVER_TEST_FIGURES)
      console.log('lua twin figures', JSON.stringify({ runs: 120, chunks }));
  }, 300_000);

  it('a remembered id is forgotten after the retention, and its id then makes a new record', async () => {
    const params: DetectorParams = {
      ...DEFAULT_PARAMS,
      minLength: 2,
      minOccurrences: 1,
      lookback: 50,
      taskIdleMs: 50,
      doneRetentionMs: 100,
    };
    const scope = { tenant: 'acme', agent: 'forget' };
    const ev = (task: string, ts: number, i: number, type = 'tool_call') =>
      toOp(
        {
          type,
          tenant_id: scope.tenant,
          agent_id: scope.agent,
          session_id: task,
          task_id: task,
          event_id: `${task}-${ts}-${type}`,
          ts,
          step: i,
          tool: `tool${i % 3}`,
        } as never,
        true,
        0,
        String(ts),
      )!;
    const task = (id: string, ts: number) => [
      ev(id, ts, 0),
      ev(id, ts + 1, 1),
      ev(id, ts + 2, 2, 'task_completed'),
    ];
    const ops: DetectorOp[] = [
      ...task('t1', 0),
      ev('t1', 1, 1), // a redelivery: duplicate
      ev('t1', 5, 1), // after its completion: late
      // Enough tasks that the remembered ids' buckets are appended to (and trimmed) while the clock passes.
      ...Array.from({ length: 40 }, (_, i) => task(`u${i}`, 10 + i * 10)).flat(),
      ...task('t1', 420), // forgotten: a new record for t1 replaces the first
      ev('t1', 421, 1), // remembered again: duplicate
    ];
    const state = new DetectorState(params);
    const prefix = unique('twin-forget');
    const store = new RedisDetectorStore(redis, params, prefix);
    for (const op of ops) {
      const mem = state.apply(op);
      const { counts: lua, changed: luaChanged } = countsOf(await store.applyBatch([op]));
      const { changed, ...memCounts } = mem;
      expect(lua).toEqual(memCounts);
      expect(luaChanged).toBe(changed);
    }
    await expectSameWindow(store, state, scope);
    expect(state.windowTasks(scope).filter((t) => t === 't1')).toHaveLength(1);
  });

  it('over days of event time, remembered ids expire, come back and keep their exact times', async () => {
    const hour = 3_600_000;
    const params: DetectorParams = {
      ...DEFAULT_PARAMS,
      minLength: 2,
      minOccurrences: 1,
      lookback: 30,
      taskIdleMs: hour / 2,
      doneRetentionMs: 30 * hour,
    };
    const scope = { tenant: 'acme', agent: 'days' };
    const call = (task: string, ts: number, step: number): DetectorOp => ({
      kind: 'call',
      scope,
      task,
      eventId: `${task}-${ts}-${step}`,
      ts,
      step,
      tool: `tool${step % 3}`,
      cost: 10_000,
      partition: 0,
    });
    const done = (task: string, ts: number): DetectorOp => ({
      kind: 'done',
      scope,
      task,
      eventId: `${task}-${ts}-done`,
      ts,
      partition: 0,
    });
    const ops: DetectorOp[] = [];
    for (let i = 0; i < 90; i++) {
      const ts = i * 2 * hour + (i % 7) * 1_000;
      ops.push(call(`u${i}`, ts, 0), call(`u${i}`, ts + 1, 1), done(`u${i}`, ts + 2));
      // Remembered (12 hours old): late. Forgotten (40 hours old): opens its task again.
      if (i >= 6) ops.push(call(`u${i - 6}`, ts + 3, 2));
      if (i >= 20) ops.push(call(`u${i - 20}`, ts + 4, 2), done(`u${i - 20}`, ts + 5));
    }
    const state = new DetectorState(params);
    const store = new RedisDetectorStore(redis, params, unique('twin-days'));
    for (const op of ops) {
      const { changed, ...mem } = state.apply(op);
      const { counts: lua, changed: luaChanged } = countsOf(await store.applyBatch([op]));
      expect(lua).toEqual(mem);
      expect(luaChanged).toBe(changed);
    }
    await expectSameWindow(store, state, scope);
  });

  it('a window over several buckets keeps the (ts, task_id) order, ties included, by count and by time', async () => {
    const scope = { tenant: 'acme', agent: 'buckets' };
    for (const windowMs of [null, 900]) {
      const params: DetectorParams = {
        ...DEFAULT_PARAMS,
        minLength: 2,
        minOccurrences: 2,
        lookback: 250,
        windowMs,
      };
      const ops: DetectorOp[] = [];
      // 600 tasks completing in groups of 4 at the same ts (ties broken by task_id bytes across buckets).
      for (let t = 0; t < 600; t++) {
        const task = `task-${(t * 7919) % 600}`;
        const ts = Math.floor(t / 4) * 10;
        for (let i = 0; i < 3; i++)
          ops.push({
            kind: 'call',
            scope,
            task,
            eventId: `${task}-${i}`,
            ts,
            step: i,
            tool: `tool${(t + i) % 5}`,
            cost: 10_000 * (i + 1),
            partition: 0,
          });
        ops.push({ kind: 'done', scope, task, eventId: `${task}-done`, ts, partition: 0 });
      }
      const state = new DetectorState(params);
      const store = new RedisDetectorStore(redis, params, unique('twin-buckets'));
      await applyInChunks(state, store, ops, rng(7), 40);
      const snap = await expectSameWindow(store, state, scope);
      expect(snap.records).toHaveLength(state.windowTasks(scope).length);
    }
  });

  it('evicts the oldest record over many buckets when records complete out of ts order, ids coming back', async () => {
    // 13 window buckets (a heap of their heads finds the oldest): completions out of order, ties, ids reused.
    const scope = { tenant: 'acme', agent: 'many-buckets' };
    const r = rng(11);
    for (const windowMs of [null, 40_000]) {
      const params: DetectorParams = {
        ...DEFAULT_PARAMS,
        minLength: 2,
        minOccurrences: 2,
        lookback: 1_250,
        windowMs,
      };
      const ops: DetectorOp[] = [];
      for (let t = 0; t < 4_000; t++) {
        const task = `k-${Math.floor(r() * 3_000)}`;
        const ts = 1_000 + t * 10 + Math.floor(r() * 5) * 100;
        ['a', 'b'].forEach((x, i) =>
          ops.push({
            kind: 'call',
            scope,
            task,
            eventId: `${task}-${t}-${i}`,
            ts,
            step: i,
            tool: `${x}${t % (11 + i)}`,
            cost: 10_000,
            partition: 0,
          }),
        );
        ops.push({
          kind: 'done',
          scope,
          task,
          eventId: `${task}-${t}-done`,
          ts: ts + Math.floor(r() * 3) * 10,
          partition: 0,
        });
      }
      const state = new DetectorState(params);
      const store = new RedisDetectorStore(redis, params, unique('twin-heap'));
      await applyInChunks(state, store, ops, r, 300);
      const snap = await expectSameWindow(store, state, scope);
      expect(snap.records).toHaveLength(state.windowTasks(scope).length);
    }
  });

  it('tools past the one-byte codes (63 per scope) are counted and read back by name', async () => {
    const params: DetectorParams = { ...DEFAULT_PARAMS, minLength: 2, minOccurrences: 2, lookback: 400 };
    const scope = { tenant: 'acme', agent: 'many-tools' };
    const ops: DetectorOp[] = [];
    // 2,200 tool names: one-, two- and three-byte codes; each pair of neighbours repeats in two tasks.
    for (let t = 0; t < 220; t++)
      for (const copy of [0, 1]) {
        const task = `t${t}-${copy}`;
        for (let i = 0; i < 11; i++)
          ops.push({
            kind: 'call',
            scope,
            task,
            eventId: `${task}-${i}`,
            ts: t * 100 + copy * 50 + i,
            step: i,
            tool: `tool-${t * 10 + i}`,
            cost: 10_000,
            partition: 0,
          });
        ops.push({
          kind: 'done',
          scope,
          task,
          eventId: `${task}-done`,
          ts: t * 100 + copy * 50 + 20,
          partition: 0,
        });
      }
    const state = new DetectorState(params);
    state.applyAll(ops);
    const store = new RedisDetectorStore(redis, params, unique('twin-tools'));
    await store.applyBatch(ops);
    const snap = await store.snapshot(scope);
    expect(snap.stats.length).toBeGreaterThan(2000);
    expect(sortStats(snap.stats)).toEqual(sortStats(state.frequentStats(scope)));
    expect(sortRecords(snap.records)).toEqual(sortRecords(state.windowRecords(scope)));
  });
  it('tool names leave the dictionary with the last window record using them, also in v4 state upgraded in place', async () => {
    const params: DetectorParams = { ...DEFAULT_PARAMS, minLength: 2, minOccurrences: 2, lookback: 5 };
    const scope = { tenant: 'acme', agent: 'fresh-tools' };
    const prefix = unique('twin-fresh');
    const keys = detectorKeys(prefix, scope);
    const ops: DetectorOp[] = [];
    // Each task reads its own document (a tool name carrying an id) between two tools every task calls.
    for (let t = 0; t < 300; t++) {
      ['search', `read-doc-${t}`, 'reply', ...(t % 7 === 0 ? [`tag-${t % 21}`] : [])].forEach((tool, step) =>
        ops.push({
          kind: 'call',
          scope,
          task: `t${t}`,
          eventId: `t${t}-${step}`,
          ts: t * 10 + step,
          step,
          tool,
          cost: 10_000,
          partition: 0,
        }),
      );
      ops.push({ kind: 'done', scope, task: `t${t}`, eventId: `t${t}-done`, ts: t * 10 + 5, partition: 0 });
    }
    const state = new DetectorState(params);
    const store = new RedisDetectorStore(redis, params, prefix);
    const r = rng(7);
    for (let i = 0, chunk = 0; i < ops.length; chunk++) {
      const batch = ops.slice(i, i + 1 + Math.floor(r() * 20));
      i += batch.length;
      state.applyAll(batch);
      await store.applyBatch(batch);
      // Midway, the state as layout v4 (no counts) left it: upgraded in place, counted from the records.
      if (chunk === 40) {
        await redis.del(`${keys.tools}:refs`);
        await redis.hset(keys.meta, 'cfg', stateFingerprint(params).replace(/\|v5$/, '|v4'));
      }
      if (chunk === 41) expect(await redis.hget(keys.meta, 'cfg')).toBe(stateFingerprint(params));
      const inWindow = new Set(state.windowRecords(scope).flatMap((x) => x.tools));
      const names = ((await redis.get(keys.tools)) ?? '').split('\u001f').filter((n) => n !== '');
      expect(new Set(names)).toEqual(inWindow);
      expect(names).toHaveLength(inWindow.size);
    }
    // The slots freed were taken again: the dictionary is no longer than the names it ever held at once.
    expect(((await redis.get(keys.tools)) ?? '').split('\u001f').length).toBeLessThanOrEqual(5 * 4);
    await expectSameWindow(store, state, scope);
    const refs = await redis.hgetall(`${keys.tools}:refs`);
    expect(Object.values(refs).reduce((a, n) => a + Number(n), 0)).toBe(
      state.windowRecords(scope).reduce((a, x) => a + x.tools.length, 0),
    );
  });
});
