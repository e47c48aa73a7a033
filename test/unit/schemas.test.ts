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
