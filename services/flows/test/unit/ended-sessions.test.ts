import { describe, expect, it } from 'vitest';
import { LIMITS } from '../../../../schemas/limits.js';
import {
  EndedSessions,
  MAX_ENDED_BYTES,
  MAX_ENDED_SESSIONS,
  RECENT_EVENT_IDS,
  sessionKey,
} from '../../src/core/sessions.js';

const key = (i: number) => sessionKey('default', 'agent', `session-${i}`);
/** Request ids as long as the contract allows, of characters V8 keeps two bytes each. */
const longIds = (i: number) =>
  Array.from({ length: RECENT_EVENT_IDS }, (_, j) => `${i}:${j}:`.padEnd(LIMITS.idLength, '中'));
const uuid = (i: number, j: number) => `00000000-0000-4000-8000-${String(i * 100 + j).padStart(12, '0')}`;

describe('ended sessions in memory: bounded by count and by bytes', () => {
  it('the worst case (10,000 ends of 32 ids of 256 characters) stays within MAX_ENDED_BYTES, the latest kept', () => {
    const ended = new EndedSessions();
    const dropped: string[] = [];
    for (let i = 0; i < MAX_ENDED_SESSIONS; i++)
      dropped.push(...ended.remember(key(i), { at: `0:${i}`, requests: longIds(i) }));
    expect(ended.bytes).toBeLessThanOrEqual(MAX_ENDED_BYTES);
    // What 32 ids of 256 characters cost each: well under 10,000 of them fit.
    expect(ended.size).toBeLessThan(MAX_ENDED_SESSIONS / 4);
    expect(ended.size + dropped.length).toBe(MAX_ENDED_SESSIONS);
    // The oldest go first, and the latest keep their ids whole.
    expect(dropped).toEqual(Array.from({ length: dropped.length }, (_, i) => key(i)));
    expect(ended.get(key(0))).toBeUndefined();
    const last = MAX_ENDED_SESSIONS - 1;
    expect(ended.get(key(last))).toEqual({ at: `0:${last}`, requests: longIds(last) });
    expect(ended.get(key(last - ended.size + 1))?.requests).toHaveLength(RECENT_EVENT_IDS);
    // The estimate counts at least what the ids' characters take as two-byte strings.
    expect(ended.bytes).toBeGreaterThan(ended.size * RECENT_EVENT_IDS * LIMITS.idLength * 2);
  });

  it('keeps all 10,000 of a few ids of UUID size each; the count bound drops the oldest past that', () => {
    const ended = new EndedSessions();
    for (let i = 0; i < MAX_ENDED_SESSIONS; i++)
      expect(
        ended.remember(key(i), { at: `3:${i}`, requests: [uuid(i, 0), uuid(i, 1), uuid(i, 2)] }),
      ).toEqual([]);
    expect(ended.size).toBe(MAX_ENDED_SESSIONS);
    expect(ended.bytes).toBeLessThanOrEqual(MAX_ENDED_BYTES);
    expect(ended.remember(key(MAX_ENDED_SESSIONS), { at: '3:x' })).toEqual([key(0)]);
    expect(ended.size).toBe(MAX_ENDED_SESSIONS);
  });

  it('an end remembered again is the latest, counted once; the bytes follow what is held', () => {
    const ended = new EndedSessions(10, 1_000_000);
    ended.remember(key(1), { at: '0:1', requests: ['a'] });
    const one = ended.bytes;
    ended.remember(key(2), { at: '0:2', requests: ['b'] });
    ended.remember(key(1), { at: '0:3', requests: ['a', 'c'] });
    expect(ended.size).toBe(2);
    expect(ended.bytes).toBeGreaterThan(2 * one);
    expect(ended.get(key(1))).toEqual({ at: '0:3', requests: ['a', 'c'] });
    // A bound of one end's size: the older goes, the latest stays even when over it.
    const tight = new EndedSessions(10, 1);
    expect(tight.remember(key(1), { requests: ['a'] })).toEqual([]);
    expect(tight.remember(key(2), { requests: ['b'] })).toEqual([key(1)]);
    expect(tight.size).toBe(1);
    ended.clear();
    expect([ended.size, ended.bytes]).toEqual([0, 0]);
  });
});
