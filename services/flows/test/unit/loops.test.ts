import { describe, expect, it } from 'vitest';
import { flowCandidate, flowDefinitionV1, type FlowStep } from '../../../../schemas/index.js';
import { DEFAULT_OUTCOME_POLICY, OutcomeMemory, outcomeScores } from '../../src/core/outcomes.js';
import { flowsFromCandidates, loopsOf, registerManual, stepsOf } from '../../src/core/registry.js';
import { matchSteps, planOf } from '../../src/core/score.js';

const step = (tool: string, i: number): FlowStep => ({
  id: `step_${i + 1}`,
  name: tool,
  skill_key: tool,
  depends_on: i === 0 ? [] : [`step_${i}`],
  output_key: `step_${i + 1}`,
  retry_max: 2,
  retry_backoff: 1,
  timeout_seconds: 120,
  on_failure: 'stop',
  input_map: { input: i === 0 ? '{{_trigger.input}}' : `{{step_${i}.output}}` },
});
const steps = (tools: string[]) => tools.map(step);
const shape = (tools: string[]) => loopsOf(steps(tools)).map((x) => [x.step.skill_key, x.body ?? 0]);

describe('loops in a candidate', () => {
  it('a tool repeated consecutively becomes one step with for_each', () => {
    expect(shape(['user', 'res', 'res', 'res'])).toEqual([
      ['user', 0],
      ['res', 1],
    ]);
    expect(shape(['a', 'b', 'c'])).toEqual([
      ['a', 0],
      ['b', 0],
      ['c', 0],
    ]);
  });
  it('a repeated block becomes one loop over the block', () => {
    expect(shape(['u', 'r', 's', 'r', 's', 'x'])).toEqual([
      ['u', 0],
      ['r', 2],
      ['s', 0],
      ['x', 0],
    ]);
  });
  it('flow steps: renumbered, chained, loop list unknown, arguments marked unbound rather than guessed', () => {
    const out = stepsOf(steps(['u', 'r', 'r']));
    expect(out.map((s) => s.id)).toEqual(['step_1', 'step_2']);
    expect(out[1]).toMatchObject({
      skill_key: 'r',
      depends_on: ['step_1'],
      for_each: { over: null, body: 1 },
      inputs: 'unknown',
      input_map: {},
    });
    expect(out[0]!.for_each).toBeUndefined();
  });
  it('from-candidates writes a loop step that the flows file schema reads back', () => {
    const c = flowCandidate.parse({
      tool_sequence: ['u', 'r', 'r', 'r'],
      occurrence_count: 3,
      match_type: 'exact',
      estimated_token_savings: 1,
      avg_cost_per_execution: 1,
      dedupe_key: 'flow_offload:u→r→r→r',
      proposed_flow: { name: 'n', description: 'd', steps: steps(['u', 'r', 'r', 'r']), tags: [] },
    });
    const [f] = flowsFromCandidates([c], { tenant: 'default', agent: 'default' });
    const back = flowDefinitionV1.parse(JSON.parse(JSON.stringify(f)));
    expect(planOf(back.steps)).toEqual([{ tool: 'u' }, { tool: 'r', body: 1 }]);
  });
});

describe('scoring a for_each step', () => {
  const loop = [{ tool: 'u' }, { tool: 'r', body: 1 }, { tool: 'c' }];
  it('matches one or more consecutive calls of its tool, each call a matched step', () => {
    expect(matchSteps(loop, ['u', 'r', 'c'])).toEqual({ proposed: 3, matched: 3 });
    expect(matchSteps(loop, ['u', 'r', 'r', 'r', 'c', 'z'])).toEqual({ proposed: 5, matched: 5 });
  });
  it('zero repetitions is a mismatch; the step after the loop must follow', () => {
    expect(matchSteps(loop, ['u', 'c'])).toEqual({ proposed: 2, matched: 1 });
    expect(matchSteps(loop, ['u', 'r', 'r', 'z'])).toEqual({ proposed: 4, matched: 3 });
  });
  it('a loop over a block takes complete repetitions only', () => {
    const block = [{ tool: 'r', body: 2 }, { tool: 's' }, { tool: 'c' }];
    expect(matchSteps(block, ['r', 's', 'r', 's', 'c'])).toEqual({ proposed: 5, matched: 5 });
    expect(matchSteps(block, ['r', 's', 'r', 'c'])).toEqual({ proposed: 3, matched: 2 });
  });
  it('a hand-written step is scored by its skill, whatever extra fields it carries', () => {
    expect(planOf([{ name: 'n', skill_key: 'a', tool: 'other' } as never])).toEqual([{ tool: 'a' }]);
  });
  it('past outcomes judge a loop step with the same scorer', () => {
    const mem = new OutcomeMemory(10);
    mem.add({ terms: ['cancel', 'trip'], calls: ['u', 'r', 'r', 'r'] });
    const f = (name: string, s: FlowStep[]) =>
      registerManual(
        {
          tenant_id: 'default',
          agent_id: 'default',
          name,
          description: '',
          condition: '',
          desired_effects: [],
          steps: s,
        },
        0,
      );
    const loop = f('loop', stepsOf(steps(['u', 'r', 'r'])));
    const copies = f('copies', steps(['u', 'r', 'r', 'c']));
    const scores = outcomeScores(mem, ['cancel', 'trip'], [loop, copies], DEFAULT_OUTCOME_POLICY);
    expect(scores.get(loop.id)).toBe(4);
    expect(scores.get(copies.id)).toBeLessThan(scores.get(loop.id)!);
  });
  it('flow steps and plain tool names score alike', () => {
    expect(matchSteps(stepsOf(steps(['u', 'r', 'r'])), ['u', 'r', 'r', 'r'])).toEqual({
      proposed: 4,
      matched: 4,
    });
    expect(matchSteps(['u', 'r', 'r'], ['u', 'r', 'r', 'r'])).toEqual({ proposed: 3, matched: 3 });
  });
});
