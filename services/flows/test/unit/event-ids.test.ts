import { describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { completedRuns, firstSight, RECENT_EVENT_IDS, type OpenSession } from '../../src/core/sessions.js';

let ts = 1;
const ev = (type: ToolCallsEvent['type'], eventId: string, extra: Record<string, unknown> = {}) =>
  ({
    tenant_id: 'default',
    agent_id: 'a',
    session_id: 's9',
    task_id: 's9',
    type,
    event_id: eventId,
    ts: ts++,
    ...extra,
  }) as ToolCallsEvent;

describe('event_id as the idempotency key of a session', () => {
  it('a tool_call produced twice (same event_id, next in the stream) counts once in the run', () => {
    const call = ev('tool_call', 's9:call0', { step: 0, tool: 'lookup' });
    const runs = completedRuns(
      [
        ev('user_message', 's9:u', { text: 'close my account' }),
        call,
        call,
        ev('tool_call', 's9:call1', { step: 1, tool: 'close' }),
        ev('task_completed', 's9:done'),
      ],
      true,
    );
    expect(runs.map((r) => [r.calls, r.evidence?.map((c) => c.tool)])).toEqual([
      [
        ['lookup', 'close'],
        ['lookup', 'close'],
      ],
    ]);
  });

  it('a user_message sent again after its session ended opens nothing (offline, as the service)', () => {
    const first = ev('user_message', 's9:u1', { text: 'close my account' });
    const runs = completedRuns(
      [
        first,
        ev('tool_call', 's9:c0', { step: 0, tool: 'close' }),
        ev('task_completed', 's9:d1'),
        first,
        ev('user_message', 's9:u2', { text: 'change my seat' }),
        ev('tool_call', 's9:c1', { step: 0, tool: 'seat' }),
        ev('task_completed', 's9:d2'),
        // The first task's request again, after the second task ended too.
        first,
        ev('user_message', 's9:u3', { text: 'book a flight' }),
        ev('tool_call', 's9:c2', { step: 0, tool: 'book' }),
        ev('task_completed', 's9:d3'),
      ],
      false,
    );
    expect(runs.map((r) => [r.terms, r.calls])).toEqual([
      [['close', 'account'], ['close']],
      [['change', 'seat'], ['seat']],
      [['book', 'flight'], ['book']],
    ]);
  });

  it('a call repeating the tool of the one before under its own event_id is a call of its own', () => {
    const runs = completedRuns(
      [
        ev('user_message', 'u'),
        ev('tool_call', 'c0', { step: 0, tool: 'lookup' }),
        ev('tool_call', 'c1', { step: 1, tool: 'lookup' }),
        ev('task_completed', 'd'),
      ].map((e) => (e.type === 'user_message' ? { ...e, text: 'hi' } : e)),
      false,
    );
    expect(runs.map((r) => r.calls)).toEqual([['lookup', 'lookup']]);
  });

  it('a session remembers its latest RECENT_EVENT_IDS event ids, no more', () => {
    const s = { recent: [] } as unknown as OpenSession;
    for (let i = 0; i <= RECENT_EVENT_IDS; i++) expect(firstSight(s, `e${i}`)).toBe(true);
    expect(s.recent).toHaveLength(RECENT_EVENT_IDS);
    expect(firstSight(s, `e${RECENT_EVENT_IDS}`)).toBe(false);
    // The oldest went: seen again, it counts (a retry that late is not the producer's).
    expect(firstSight(s, 'e0')).toBe(true);
  });
});
