import { describe, expect, it } from 'vitest';
import { agentOrchestrationV1, type ToolCallsEvent } from '../../../../schemas/index.js';
import { compileAgent, type Agent } from '../../src/core/orchestration.js';
import {
  applyEvent,
  newSession,
  settledPosition,
  viewAt,
  type SessionState,
} from '../../src/core/session.js';

const TOOLS = ['a', 'b', 'c', 'x', 'y'];
const agentOf = (raw: Record<string, unknown>): Agent =>
  compileAgent(agentOrchestrationV1.parse({ tools: TOOLS, ...raw }));
let n = 0;
const base = { tenant_id: 'default', agent_id: 'default', session_id: 's' };
const call = (tool: string) =>
  ({ type: 'tool_call', event_id: `c${++n}`, ts: n, ...base, task_id: 't', step: n, tool }) as ToolCallsEvent;
const done = () =>
  ({ type: 'task_completed', event_id: `d${++n}`, ts: n, ...base, task_id: 't' }) as ToolCallsEvent;
function play(agent: Agent, events: ToolCallsEvent[], state: SessionState = newSession()) {
  const records = [];
  for (const e of events) {
    const o = applyEvent(agent, state, e);
    state = o.state;
    if (o.record) records.push(o.record);
  }
  return { records, state, last: records.at(-1)! };
}
/** What GET /sessions/{id}/allowed-tools answers for this state. */
const read = (agent: Agent, s: SessionState) => {
  const at = settledPosition(agent, s);
  return viewAt(at.step, at.index, agent.tools);
};

describe('task_completed records answer for the settled step, as the allowed-tools read does', () => {
  it('a task_completed record answers for the step the allowed-tools read answers for (new session, default step)', () => {
    const agent = agentOf({
      steps: [{ name: 'base', isDefault: true, availableTools: { allowed: ['a'] } }],
    });
    const r = play(agent, [done()]);
    expect({ step: r.last.active_step, tools: r.last.allowed_tools }).toEqual({
      step: read(agent, r.state).active_step,
      tools: read(agent, r.state).allowed_tools,
    });
  });

  it('a task_completed after a completing call answers for the step the next event is processed in', () => {
    const agent = agentOf({
      steps: [
        { name: 'flow', conditions: [{ type: 'sequence_match', value: ['y'] }], sequence: ['a', 'b'] },
        { name: 'base', isDefault: true, availableTools: { allowed: ['x'] } },
      ],
    });
    const r = play(agent, [call('y'), call('a'), call('b')]);
    expect(r.last).toMatchObject({ active_step: 'flow', completed: true });
    expect(read(agent, r.state).active_step).toBe('base');
    const r2 = play(agent, [done()], r.state);
    // README: "The rule then picks the next step before the next event is processed".
    expect({
      step: r2.last.active_step,
      completed: r2.last.completed,
      tools: r2.last.allowed_tools,
    }).toEqual({
      step: 'base',
      completed: false,
      tools: ['x'],
    });
  });
});
