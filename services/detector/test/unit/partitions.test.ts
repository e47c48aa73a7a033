import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { liveCandidates } from '../../src/core/detect.js';
import { toOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS, type DetectorParams } from '../../src/core/params.js';
import { DetectorState } from '../../src/core/state.js';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { batchDetect } from '../reference/batch.js';
import { partitionedRecords } from '../reference/partitioned.js';
import { makeLogs, rng } from '../reference/partition-logs.js';

/**
 * A consumer group's reading of the logs: chunks from random partitions in random order; offsets are
 * committed after some chunks only, and a stop/restart (SIGKILL, rebalance) rewinds every partition to its
 * last commit, so uncommitted chunks are read and applied again; the state itself survives (it is in Redis).
 */
function consume(logs: ToolCallsEvent[][], state: DetectorState, seed: number, requestTerms: boolean) {
  const r = rng(seed);
  const pos = logs.map(() => 0);
  const committed = logs.map(() => 0);
  let restarts = 0;
  let replayed = 0;
  let late = 0;
  for (;;) {
    const open = logs.map((l, p) => p).filter((p) => pos[p]! < logs[p]!.length);
    if (open.length === 0) break;
    if (r() < 0.05) {
      for (let p = 0; p < logs.length; p++) {
        replayed += pos[p]! - committed[p]!;
        pos[p] = committed[p]!;
      }
      restarts++;
      continue;
    }
    const p = open[Math.floor(r() * open.length)]!;
    const end = Math.min(logs[p]!.length, pos[p]! + 1 + Math.floor(r() * 8));
    for (const e of logs[p]!.slice(pos[p], end)) {
      const op = toOp(e, requestTerms, p);
      if (op) late += state.apply(op).ignoredBy.late;
    }
    pos[p] = end;
    if (r() < 0.6) committed[p] = end;
  }
  return { restarts, replayed, late };
}

const figures = { runs: 0, events: 0, restarts: 0, replayed: 0, candidates: 0, records: 0, late: 0 };

describe('per-partition stream time (issue 12)', () => {
  it('random interleavings of 3-5 partitions, stops/restarts and redeliveries give the batch answer', () => {
    fc.assert(
      fc.property(
        fc.record({
          seed: fc.integer(),
          schedule: fc.integer(),
          partitions: fc.integer({ min: 3, max: 5 }),
          tasks: fc.integer({ min: 5, max: 60 }),
          idleMs: fc.integer({ min: 15, max: 80 }),
          lookback: fc.integer({ min: 3, max: 30 }),
          minOccurrences: fc.integer({ min: 2, max: 4 }),
          windowMs: fc.option(fc.integer({ min: 50, max: 2_000 }), { nil: null }),
          requestTerms: fc.boolean(),
        }),
        (g) => {
          const params: DetectorParams = {
            ...DEFAULT_PARAMS,
            minLength: 2,
            maxLength: 6,
            maxCandidates: 4,
            lookback: g.lookback,
            minOccurrences: g.minOccurrences,
            windowMs: g.windowMs,
            taskIdleMs: g.idleMs,
            doneRetentionMs: 1e12,
            requestTerms: g.requestTerms,
          };
          const logs = makeLogs(g.seed, g.partitions, g.tasks, g.idleMs);
          const state = new DetectorState(params);
          const c = consume(logs, state, g.schedule, g.requestTerms);
          const reference = partitionedRecords(logs, g.idleMs, g.requestTerms);
          for (const agent of ['agent0', 'agent1']) {
            const scope = { tenant: 'acme', agent };
            const ref = reference.get(agent) ?? { records: [], maxTs: 0 };
            const expected = batchDetect(ref.records, ref.maxTs, params);
            const live = liveCandidates(state.frequentStats(scope), params, state.windowRecords(scope)).map(
              ({ proposed_flow: _p, ...rest }) => rest,
            );
            expect(live).toEqual(expected);
            figures.candidates += expected.length;
            figures.records += ref.records.length;
          }
          figures.runs++;
          figures.restarts += c.restarts;
          figures.replayed += c.replayed;
          figures.late += c.late;
          figures.events += logs.reduce((n, l) => n + l.length, 0);
        },
      ),
      { numRuns: 300 },
    );
    // The property must bite: restarts replay events, and most runs end with candidates.
    expect(figures.restarts).toBeGreaterThan(100);
    expect(figures.replayed).toBeGreaterThan(1_000);
    expect(figures.candidates).toBeGreaterThan(figures.runs);
    expect(figures.late).toBeGreaterThan(50);
    if (process.env.PAVER_TEST_FIGURES) console.log('partition property figures', JSON.stringify(figures));
  }, 180_000);

  it('one partition running ahead does not cut another partition’s open task (the issue-12 failure)', () => {
    const p: DetectorParams = { ...DEFAULT_PARAMS, minLength: 2, minOccurrences: 1, taskIdleMs: 100 };
    const s = new DetectorState(p);
    const scope = { tenant: 't', agent: 'a' };
    const call = (task: string, step: number, ts: number, partition: number) =>
      s.apply({
        kind: 'call',
        scope,
        task,
        eventId: `${task}-${step}`,
        ts,
        step,
        tool: `x${step}`,
        cost: 1,
        partition,
      });
    call('slow', 0, 1_000, 1);
    // Partition 0 catches up a backlog far ahead in event time.
    for (let i = 0; i < 5; i++) call(`fast-${i}`, 0, 5_000 + i, 0);
    call('slow', 1, 1_010, 1);
    const r = s.apply({ kind: 'done', scope, task: 'slow', eventId: 'slow-done', ts: 1_020, partition: 1 });
    expect(r.ignored).toBe(0);
    expect(s.windowRecords(scope).find((x) => x.tools[0] === 'x0' && x.tools.length === 2)).toBeTruthy();
    // An old run published onto partition 0, far behind its clock: counted as late, never silently dropped.
    const late = s.apply({
      kind: 'call',
      scope,
      task: 'old',
      eventId: 'o',
      ts: 10,
      step: 0,
      tool: 'y',
      cost: 1,
      partition: 0,
    });
    expect(late.ignoredBy.late).toBe(1);
  });
});
