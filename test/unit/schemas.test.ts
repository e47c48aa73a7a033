import { describe, expect, it } from 'vitest';
import { staleSchemas } from '../../schemas/generate.js';
import { CONTRACTS, toolCallsEventV1 } from '../../schemas/index.js';

describe('contracts', () => {
  it('checked-in JSON Schemas are up to date (run `npm run gen:schemas`)', () => {
    expect(staleSchemas()).toEqual([]);
  });
  it('every contract has a version', () => {
    for (const [name, c] of Object.entries(CONTRACTS)) expect(name.endsWith(`.v${c.version}`)).toBe(true);
  });
  it('rejects unpaired surrogates in ids and tool names (zod and the compiled validator alike), accepts pairs', async () => {
    const { checker } = await import('../../shared/validate.js');
    const check = checker(toolCallsEventV1);
    const event = (session: string, tool = 'search') => ({
      type: 'tool_call',
      event_id: 'e',
      ts: 1,
      session_id: session,
      task_id: 't',
      step: 0,
      tool,
    });
    for (const [v, ok] of [
      [event('s\ud800'), false],
      [event('s\udc00'), false],
      [event('\udc00\ud800'), false],
      [event('s', 'get\ud83d'), false],
      [event('s\ud83d\ude00'), true],
      [event('s', 'get_\ud83d\ude00'), true],
    ] as const) {
      expect(toolCallsEventV1.safeParse(v).success, JSON.stringify(v)).toBe(ok);
      expect(check(structuredClone(v)).ok, JSON.stringify(v)).toBe(ok);
    }
  });

  it('defaults tenant and agent, and rejects control characters in ids', () => {
    const e = toolCallsEventV1.parse({
      type: 'task_completed',
      event_id: 'e',
      ts: 1,
      session_id: 's',
      task_id: 't',
    });
    expect([e.tenant_id, e.agent_id]).toEqual(['default', 'default']);
    expect(
      toolCallsEventV1.safeParse({
        type: 'task_completed',
        event_id: 'e\u0001',
        ts: 1,
        session_id: 's',
        task_id: 't',
      }).success,
    ).toBe(false);
  });
});
