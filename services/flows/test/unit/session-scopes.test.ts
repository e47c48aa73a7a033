import { describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { completedRuns, sessionKey } from '../../src/core/sessions.js';

let ts = 1;
const ev = (
  tenant: string,
  agent: string,
  type: ToolCallsEvent['type'],
  extra: Record<string, unknown> = {},
) =>
  ({
    tenant_id: tenant,
    agent_id: agent,
    session_id: 's1',
    task_id: 's1',
    type,
    event_id: `${tenant}:${agent}:${ts}`,
    ts: ts++,
    ...extra,
  }) as ToolCallsEvent;

describe('open sessions per scope', () => {
  it('two agents, and two tenants, using the same session id each complete their own run', () => {
    const evs = [
      ev('t', 'agent-a', 'user_message', { text: 'close my account' }),
      ev('t', 'agent-b', 'user_message', { text: 'book a flight' }),
      ev('u', 'agent-a', 'user_message', { text: 'reset my password' }),
      ev('t', 'agent-a', 'tool_call', { step: 0, tool: 'lookup_account' }),
      ev('t', 'agent-b', 'tool_call', { step: 0, tool: 'search_flights' }),
      ev('u', 'agent-a', 'tool_call', { step: 0, tool: 'reset_password' }),
      ev('t', 'agent-a', 'task_completed'),
      ev('t', 'agent-b', 'task_completed'),
      ev('u', 'agent-a', 'task_completed'),
    ];
    expect(completedRuns(evs, false).map((r) => [r.tenant, r.agent, r.calls])).toEqual([
      ['t', 'agent-a', ['lookup_account']],
      ['t', 'agent-b', ['search_flights']],
      ['u', 'agent-a', ['reset_password']],
    ]);
  });

  it('a key per scope and session (ids are printable: the separator, a control character, is in none)', () => {
    expect(
      new Set([sessionKey('t', 'a', 's'), sessionKey('t', 'b', 's'), sessionKey('u', 'a', 's')]).size,
    ).toBe(3);
  });
});
