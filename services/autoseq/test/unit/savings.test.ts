import { describe, expect, it } from 'vitest';
import type { Proposal } from '../../src/core/learn/learner.js';
import { SavingsCounter } from '../../src/core/learn/savings.js';

const proposal = (tool: string, rule: string, state: 'active' | 'shadow'): Proposal => ({
  tool,
  args: {},
  origin: 'learned',
  state,
  rule_id: rule,
  confidence: 0.9,
  trials: 20,
  k: 1,
});

describe('paver savings tallies', () => {
  it('coverage is active hits over all tool calls, overall, per tool and per rule; shadow proposals are apart', () => {
    const s = new SavingsCounter();
    s.add('a', null, undefined); // a first call: nothing held
    s.add('b', proposal('b', 'r1', 'active'), true);
    s.add('b', proposal('b', 'r1', 'active'), true);
    s.add('c', proposal('b', 'r1', 'active'), false); // a proposal of b that met c: a miss of b
    s.add('c', proposal('c', 'r2', 'shadow'), true);
    s.add(null, proposal('c', 'r2', 'active'), false); // the task ended with a proposal held
    const r = s.report();
    expect(r.overall).toMatchObject({ tool_calls: 5, active_proposals: 4, hits: 2, misses: 2 });
    expect(r.overall.coverage).toBeCloseTo(2 / 5);
    expect(r.overall.precision).toBeCloseTo(2 / 4);
    expect(r.overall).toMatchObject({ shadow_proposals: 1, shadow_hits: 1 });
    expect(r.per_tool.b).toMatchObject({ tool_calls: 2, active_proposals: 3, hits: 2, misses: 1 });
    expect(r.per_tool.c).toMatchObject({ tool_calls: 2, active_proposals: 1, hits: 0, misses: 1 });
    // A rule has no calls of its own: its coverage is over every call, so the rules' coverages add up.
    expect(r.per_rule.r1!.coverage).toBeCloseTo(2 / 5);
    expect(r.per_rule.r1!.precision).toBeCloseTo(2 / 3);
    expect(r.per_rule.r2).toMatchObject({ active_proposals: 1, hits: 0, coverage: 0, precision: 0 });
  });
});
