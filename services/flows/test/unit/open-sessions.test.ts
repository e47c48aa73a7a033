import { describe, expect, it } from 'vitest';
import { LIMITS } from '../../../../schemas/limits.js';
import { MAX_OPEN_ID_BYTES, RECENT_EVENT_IDS, SessionTracker, sessionKey } from '../../src/core/sessions.js';

const key = (i: number) => sessionKey('default', 'agent', `session-${i}`);
/** An event id as long as the contract allows, of characters V8 keeps two bytes each. */
const longId = (i: number, j: number) => `${i}:${j}:`.padEnd(LIMITS.idLength, '中');
const uuid = (i: number, j: number) => `00000000-0000-4000-8000-${String(i * 100 + j).padStart(12, '0')}`;
const opening = { tenant: 'default', agent: 'agent', terms: ['refund'], shadow: null };

/** Opens session `i` and fills both its id lists (RECENT_EVENT_IDS requests, then as many calls). */
function fill(t: SessionTracker, i: number, id: (i: number, j: number) => string): void {
  for (let j = 0; j < RECENT_EVENT_IDS; j++) t.onRequest(key(i), opening, false, id(i, j));
  for (let j = 0; j < RECENT_EVENT_IDS; j++)
    t.onCall(key(i), { tool: 'get_order' }, id(i, RECENT_EVENT_IDS + j));
}

describe('open sessions in memory: their event ids bounded by bytes too', () => {
  it('sessions full of ids of 256 characters stay within MAX_OPEN_ID_BYTES, the oldest leaving first', () => {
    const t = new SessionTracker();
    const n = 2_500;
    for (let i = 0; i < n; i++) fill(t, i, longId);
    // By count alone all 2,500 stayed (about 86 MB of ids); the bytes bound keeps fewer.
    expect(t.size).toBeLessThan(n);
    expect(t.idBytes).toBeLessThanOrEqual(MAX_OPEN_ID_BYTES);
    expect(t.get(key(0))).toBeUndefined();
    const first = n - t.size;
    expect(t.get(key(first - 1))).toBeUndefined();
    // The ones kept are the latest, their lists whole.
    for (const i of [first, n - 1]) {
      const s = t.get(key(i))!;
      expect(s.requests).toHaveLength(RECENT_EVENT_IDS);
      expect(s.recent).toHaveLength(RECENT_EVENT_IDS);
      expect(s.calls).toHaveLength(RECENT_EVENT_IDS);
    }
    // The estimate counts at least what the ids' characters take as two-byte strings.
    expect(t.idBytes).toBeGreaterThan(t.size * 2 * RECENT_EVENT_IDS * LIMITS.idLength * 2);
  });

  it('keeps all 10,000 of both lists full of UUID-sized ids', () => {
    const t = new SessionTracker();
    for (let i = 0; i < 10_000; i++) fill(t, i, uuid);
    expect(t.size).toBe(10_000);
    expect(t.idBytes).toBeLessThanOrEqual(MAX_OPEN_ID_BYTES);
    expect(t.get(key(0))?.requests).toHaveLength(RECENT_EVENT_IDS);
  });

  it('counts what is held: ids replaced in the lists, sessions ended, restored and forgotten', () => {
    const t = new SessionTracker(10, 1_000, Number.POSITIVE_INFINITY, 1_000_000);
    fill(t, 1, uuid);
    const one = t.idBytes;
    expect(one).toBeGreaterThan(0);
    // Past RECENT_EVENT_IDS the oldest id leaves each list: the count stays as it was.
    t.onRequest(key(1), opening, false, uuid(1, 90));
    t.onCall(key(1), { tool: 'get_order' }, uuid(1, 91));
    expect(t.idBytes).toBe(one);
    // A call already seen changes nothing.
    t.onCall(key(1), { tool: 'get_order' }, uuid(1, 91));
    expect(t.idBytes).toBe(one);
    const s = t.onDone(key(1))!;
    expect(t.idBytes).toBe(0);
    t.restore(key(1), s);
    expect(t.idBytes).toBe(one);
    t.clear();
    expect([t.size, t.idBytes]).toEqual([0, 0]);
  });

  it('with a store (deferBound), sessions leave memory only when told (trim), after their batch is saved', () => {
    const t = new SessionTracker(10_000, 1_000, Number.POSITIVE_INFINITY, 1);
    t.deferBound = true;
    for (let i = 0; i < 3; i++) fill(t, i, uuid);
    expect(t.size).toBe(3);
    t.trim();
    // The latest stays, whatever its ids.
    expect(t.size).toBe(1);
    expect(t.get(key(2))?.recent).toHaveLength(RECENT_EVENT_IDS);
  });
});
