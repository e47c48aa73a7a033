import { describe, expect, it } from 'vitest';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';
import { DetectorState } from '../../src/core/state.js';

const scope = { tenant: 'default', agent: 'default' };

/**
 * README: "duplicate: an event already in its open task ... (a redelivery)". A redelivered user_message of an
 * open task was counted as applied again (paver_detector_events_total{outcome="applied"} over-counts, and
 * events_ignored_total{reason="duplicate"} missed it); apply-11.lua did the same.
 */
describe('a redelivered user_message', () => {
  it('that the task kept is counted as a duplicate, not applied twice (core; the Lua twin is held equal in lua-twin.int)', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    const msg: DetectorOp = { kind: 'msg', scope, task: 't1', eventId: 'm1', ts: 1000, terms: ['invoice'] };
    const call: DetectorOp = {
      kind: 'call',
      scope,
      task: 't1',
      eventId: 'c1',
      ts: 1001,
      step: 0,
      tool: 'a',
      cost: 10_000,
    };
    s.applyAll([msg, call]);
    const again = s.applyAll([msg, call]);
    expect(again.ignoredBy.duplicate).toBe(2);
    expect(again.applied).toBe(0);
  });
});
