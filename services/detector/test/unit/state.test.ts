import { describe, expect, it } from 'vitest';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';
import { DetectorState } from '../../src/core/state.js';

const scope = { tenant: 't', agent: 'a' };
const IDLE = DEFAULT_PARAMS.taskIdleMs;
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
const done = (task: string, ts: number): DetectorOp => ({
  kind: 'done',
  scope,
  task,
  eventId: `${task}-done`,
  ts,
});

/** The reason the last op was ignored for, after the others were applied. */
function reasonOfLast(ops: DetectorOp[]): string {
  const s = new DetectorState(DEFAULT_PARAMS);
  for (const op of ops.slice(0, -1)) s.apply(op);
  const r = s.apply(ops[ops.length - 1]!);
  const reasons = Object.entries(r.ignoredBy).filter(([, n]) => n > 0);
  return reasons.length === 0 ? 'applied' : reasons.map(([k]) => k).join(',');
}

describe('late or duplicate at a task close', () => {
  it('an event exactly DETECTOR_TASK_IDLE_MS after the task’s last one comes after its idle close: late', () => {
    // The gap of exactly the idle time closes the task (the sweep closes at last + idle ≤ clock), so this event,
    // never seen before, is not a redelivery.
    expect(reasonOfLast([call('t1', 'e1', 1_000), call('t1', 'e2', 1_000 + IDLE)])).toBe('late');
    expect(reasonOfLast([call('t1', 'e1', 1_000), done('t1', 1_000 + IDLE)])).toBe('late');
    // Closed by another task's event at the same time: the same.
    expect(
      reasonOfLast([call('t1', 'e1', 1_000), call('t2', 'f1', 1_000 + IDLE), call('t1', 'e2', 1_000 + IDLE)]),
    ).toBe('late');
  });

  it('what comes at or before the task’s last event after an idle close is a redelivery: duplicate; a gap one ms short keeps the task open', () => {
    expect(
      reasonOfLast([call('t1', 'e1', 1_000), call('t2', 'f1', 1_000 + IDLE), call('t1', 'e1', 1_000)]),
    ).toBe('duplicate');
    expect(
      reasonOfLast([call('t1', 'e1', 1_000), call('t2', 'f1', 1_000 + IDLE), call('t1', 'e0', 999)]),
    ).toBe('duplicate');
    expect(reasonOfLast([call('t1', 'e1', 1_000), call('t1', 'e2', 1_000 + IDLE - 1)])).toBe('applied');
  });

  it('an event between the task’s last event and its idle close, arriving after the close, was never seen: late', () => {
    // Its ts is after the task's last event, so the open task never had it (its last ts would be it): not a
    // redelivery, however near the close. It was counted a duplicate up to one ms before the close.
    for (const ts of [1_001, 1_000 + IDLE / 2, 1_000 + IDLE - 1])
      expect(
        reasonOfLast([call('t1', 'e1', 1_000), call('t2', 'f1', 1_000 + IDLE), call('t1', 'e2', ts)]),
      ).toBe('late');
    // The last event is the task's newest ts, whatever order its events came in.
    expect(
      reasonOfLast([
        call('t1', 'e1', 1_500),
        call('t1', 'e0', 1_000),
        call('t2', 'f1', 1_500 + IDLE),
        call('t1', 'e2', 1_200),
      ]),
    ).toBe('duplicate');
    expect(
      reasonOfLast([
        call('t1', 'e1', 1_500),
        call('t1', 'e0', 1_000),
        call('t2', 'f1', 1_500 + IDLE),
        call('t1', 'e2', 1_501),
      ]),
    ).toBe('late');
  });

  it('an idle-closed task’s id is remembered DETECTOR_DONE_RETENTION_MS after its close, not after its last event', () => {
    // Were it remembered only that long after its last event, an event less than the idle time behind the
    // clock would reopen the task once the id was forgotten, and that fragment would replace its record.
    const p = { ...DEFAULT_PARAMS, taskIdleMs: 100, doneRetentionMs: 100 };
    const reason = (clock: number) => {
      const s = new DetectorState(p);
      s.apply(call('t1', 'e1', 0));
      s.apply(call('t2', 'f1', 100)); // closes t1 (idle) at 100
      s.apply(call('t2', 'f2', clock));
      const r = s.apply(call('t1', 'e2', 150));
      const reasons = Object.entries(r.ignoredBy).filter(([, n]) => n > 0);
      return reasons.length === 0 ? 'applied' : reasons.map(([k]) => k).join(',');
    };
    expect(reason(200)).toBe('late');
    // Forgotten once the clock is past close + retention: t1 is then a new task (its event is not idle yet).
    expect(reason(201)).toBe('applied');
  });

  it('a task_completed close keeps its boundary: at its ts a duplicate, after it late', () => {
    expect(reasonOfLast([call('t1', 'e1', 1_000), done('t1', 2_000), done('t1', 2_000)])).toBe('duplicate');
    expect(reasonOfLast([call('t1', 'e1', 1_000), done('t1', 2_000), call('t1', 'e2', 2_000)])).toBe(
      'duplicate',
    );
    expect(reasonOfLast([call('t1', 'e1', 1_000), done('t1', 2_000), call('t1', 'e2', 2_001)])).toBe('late');
  });

  it('the idle-closed record keeps its completion ts (last + idle) in the window order', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    s.apply(call('tb', 'e1', 1_000));
    s.apply(call('ta', 'f1', 1_000 + IDLE - 1));
    s.apply(done('ta', 1_000 + IDLE));
    // tb closes at 1000 + IDLE too: the tie goes by task id, so ta comes first. At its last own ts (one ms
    // earlier) tb's record would come first: the id order alone cannot hide that.
    s.apply(call('tc', 'g1', 1_000 + 2 * IDLE));
    expect(s.windowTasks(scope)).toEqual(['ta', 'tb']);
  });
});
