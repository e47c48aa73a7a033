import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { replay } from '../../../../cli/flows-replay.js';

let ts = 1_760_000_000_000;
const ev = (tenant: string, type: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    tenant_id: tenant,
    agent_id: 'default',
    session_id: 's1',
    task_id: 's1',
    type,
    event_id: `${tenant}:${ts}`,
    ts: ts++,
    ...extra,
  });

describe('paver flows replay per scope', () => {
  it("scores a chosen flow against its own scope's session when another scope uses the same session id", async () => {
    // Session ids are the agents' own: two tenants may both have an "s1" open at once. The replay kept the
    // chosen flow and the calls of a session by its id alone, so tenant u's end scored tenant t's flow
    // against u's calls (nothing proposed), and t's own calls were then scored against nothing.
    const dir = mkdtempSync(join(tmpdir(), 'paver-replay-scopes-'));
    const flows = join(dir, 'flows.json');
    writeFileSync(
      flows,
      JSON.stringify([
        {
          tenant_id: 't',
          agent_id: 'default',
          name: 'refund_order',
          description: 'Refund an order.',
          condition: 'The user asks for a refund of an order.',
          desired_effects: ['order refunded'],
          steps: [
            { name: 'Lookup', skill_key: 'order_lookup' },
            { name: 'Refund', skill_key: 'payments_refund' },
          ],
        },
      ]),
    );
    const input = join(dir, 'events.jsonl');
    writeFileSync(
      input,
      [
        ev('t', 'user_message', { text: 'refund my order please' }),
        ev('u', 'user_message', { text: 'refund my order please' }),
        ev('u', 'tool_call', { step: 0, tool: 'web_search' }),
        ev('u', 'task_completed'),
        ev('t', 'tool_call', { step: 0, tool: 'order_lookup' }),
        ev('t', 'tool_call', { step: 1, tool: 'payments_refund' }),
        ev('t', 'task_completed'),
      ].join('\n') + '\n',
    );
    const r = await replay({ input, flows, promotion: { mode: 'manual' }, env: {} });
    // t's request chose the flow, u's (a scope without flows) nothing.
    expect(r.choices.map((c) => c.chosen.length)).toEqual([1, 0]);
    expect(r.chosen).toBe(1);
    expect({ proposed: r.proposed, matched: r.matched }).toEqual({ proposed: 2, matched: 2 });
    expect(r.per_flow.map((f) => [f.chosen, f.started, f.matched, f.proposed])).toEqual([[1, 1, 2, 2]]);
  });
});
