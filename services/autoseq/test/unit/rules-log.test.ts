import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  contextRecordKey,
  contextRecordValue,
  forgetMarkerKey,
  forgetMarkerValue,
  restoreVerdict,
  rulesOfLog,
  scopeRecordKey,
  scopeRecordValue,
  type ScopeCopyRead,
} from '../../src/adapters/kafka/rules-log.js';
import { SCRIPT_DIR, SCRIPTS } from '../../src/adapters/redis/scope-lease.js';

const P = 'p';
const ctx = (agent: string, c: string, value = '{"n":{}}', forgets = 0) =>
  [contextRecordKey(P, 't', agent, c), contextRecordValue(value, forgets)] as const;
const scope = (agent: string, forgets = 0, at = 1_000) =>
  [scopeRecordKey(P, 't', agent), scopeRecordValue(7, undefined, at, forgets)] as const;
const marker = (agent: string, forgets: number) =>
  [forgetMarkerKey(P, 't', agent), forgetMarkerValue(forgets, 5_000)] as const;
const read = (records: (readonly [string, string | null])[]) => rulesOfLog(new Map(records), P);
const byAgent = (scopes: ScopeCopyRead[]) => Object.fromEntries(scopes.map((s) => [s.agent, s]));

describe('the rules topic as a restore reads it: forget markers', () => {
  it('a scope record carries its forget generation only once the scope was forgotten (older bytes otherwise)', () => {
    expect(scopeRecordValue(3, undefined, 10)).toBe('{"v":1,"clock":3,"at":10}');
    expect(scopeRecordValue(3, undefined, 10, 2)).toBe('{"v":1,"clock":3,"at":10,"forgets":2}');
    expect(forgetMarkerKey(P, 't', 'a')).toBe('["p","t","a",null]');
  });

  it('a context record carries the generation of its copy only once the scope was forgotten (older bytes otherwise)', () => {
    expect(contextRecordValue('{"n":{}}')).toBe('{"v":1,"value":"{\\"n\\":{}}"}');
    expect(contextRecordValue('{}', 2)).toBe('{"v":1,"value":"{}","forgets":2}');
  });

  it("reads each context's generation (absent while 0), which counts towards the scope's highest", () => {
    const { scopes, skipped, generations } = read([
      scope('a', 2),
      ctx('a', 'old'),
      ctx('a', 'new', '{}', 2),
      ctx('a', 'odd', '{}', 3),
      marker('a', 2),
      // A generation of 0 is never written: not this version's record.
      [contextRecordKey(P, 't', 'a', 'zero'), '{"v":1,"value":"{}","forgets":0}'],
    ]);
    expect(skipped).toBe(1);
    expect([...scopes[0]!.ctxs.keys()].sort()).toEqual(['new', 'odd', 'old']);
    expect(scopes[0]!.ctxForgets).toEqual(
      new Map([
        ['new', 2],
        ['odd', 3],
      ]),
    );
    expect(generations).toEqual([{ tenant: 't', agent: 'a', forgets: 3 }]);
  });

  it('reads each scope with its marker, and the highest generation the topic holds per scope', () => {
    const { scopes, skipped, generations } = read([
      scope('stale', 0),
      ctx('stale', 'x'),
      marker('stale', 1),
      scope('again', 2),
      ctx('again', 'x'),
      marker('again', 2),
      scope('never'),
      ctx('never', 'x'),
      // A marker alone (the scope forgotten, its records tombstoned): no scope, a generation all the same.
      marker('gone', 3),
      [scopeRecordKey(P, 't', 'gone'), null],
      // Another prefix's marker, and a marker this version cannot read.
      [forgetMarkerKey('q', 't', 'stale'), forgetMarkerValue(9, 0)],
      [forgetMarkerKey(P, 't', 'bad'), '{"v":1,"forgets":0}'],
    ]);
    const s = byAgent(scopes);
    expect(Object.keys(s).sort()).toEqual(['again', 'never', 'stale']);
    expect(s.stale).toMatchObject({ forgotten: 1 });
    expect(s.stale!.forgets).toBeUndefined();
    expect(s.again).toMatchObject({ forgets: 2, forgotten: 2 });
    expect(s.never!.forgotten).toBeUndefined();
    expect(skipped).toBe(1);
    expect(generations.sort((a, b) => (a.agent < b.agent ? -1 : 1))).toEqual([
      { tenant: 't', agent: 'again', forgets: 2 },
      { tenant: 't', agent: 'gone', forgets: 3 },
      { tenant: 't', agent: 'stale', forgets: 1 },
    ]);
  });

  it('a copy read after a forget whose marker is lower still raises the generation (a forget whose marker was not sent)', () => {
    const { generations } = read([scope('a', 4), ctx('a', 'x'), marker('a', 3)]);
    expect(generations).toEqual([{ tenant: 't', agent: 'a', forgets: 4 }]);
  });
});

describe('restoreVerdict: what a restore writes back', () => {
  const copy = (over: Partial<ScopeCopyRead>): ScopeCopyRead => ({
    tenant: 't',
    agent: 'a',
    clock: 1,
    ctxs: new Map([['x', '{}']]),
    ...over,
  });
  const HOUR = 3_600_000;

  it('leaves out a copy read before the latest forget, at any TTL and whatever its age', () => {
    for (const ttl of [0, HOUR]) {
      expect(restoreVerdict(copy({ forgets: 0, forgotten: 1, at: 999 }), ttl, 1_000)).toEqual({
        restore: false,
        why: 'forgotten',
      });
      expect(restoreVerdict(copy({ forgets: 2, forgotten: 3 }), ttl, 1_000)).toEqual({
        restore: false,
        why: 'forgotten',
      });
      // A copy of an older version (no generation, no time) reads as before any forget.
      expect(restoreVerdict(copy({ forgotten: 1 }), ttl, 1_000)).toEqual({
        restore: false,
        why: 'forgotten',
      });
    }
  });

  it('restores a copy read after the forget (the scope learned again), and any copy of a scope never forgotten', () => {
    const x = new Map([['x', '{}']]);
    const at1 = new Map([['x', 1]]);
    expect(restoreVerdict(copy({ forgets: 1, forgotten: 1, ctxForgets: at1 }), 0, 1_000)).toEqual({
      restore: true,
      leftMs: 0,
      ctxs: x,
      stale: [],
    });
    expect(
      restoreVerdict(copy({ forgets: 4, forgotten: 3, at: 0, ctxForgets: new Map([['x', 4]]) }), HOUR, 1_000),
    ).toEqual({ restore: true, leftMs: HOUR - 1_000, ctxs: x, stale: [] });
    expect(restoreVerdict(copy({}), 0, 1_000)).toEqual({ restore: true, leftMs: 0, ctxs: x, stale: [] });
    expect(restoreVerdict(copy({}), HOUR, 1_000)).toEqual({
      restore: true,
      leftMs: HOUR,
      ctxs: x,
      stale: [],
    });
  });

  it("writes back only the contexts copied after the scope's latest forget: a stale copy's contexts stay out", () => {
    const s = copy({
      forgets: 2,
      forgotten: 2,
      ctxs: new Map([
        ['again', '{"a":1}'],
        ['stale', '{"s":1}'],
        ['older', '{"o":1}'],
        ['later', '{"l":1}'],
      ]),
      // `older`: a copy of an older version, or of the scope never forgotten before (no generation: 0).
      ctxForgets: new Map([
        ['again', 2],
        ['stale', 1],
        ['later', 3],
      ]),
    });
    for (const ttl of [0, HOUR])
      expect(restoreVerdict(s, ttl, 1_000)).toEqual({
        restore: true,
        leftMs: ttl,
        ctxs: new Map([
          ['again', '{"a":1}'],
          ['later', '{"l":1}'],
        ]),
        stale: ['stale', 'older'],
      });
  });

  it('takes the generation Redis holds as the marker when higher (a forget whose marker the topic lacks, or lost to a lower one landing last)', () => {
    expect(
      restoreVerdict(copy({ forgets: 1, forgotten: 1, ctxForgets: new Map([['x', 1]]) }), 0, 0, 2),
    ).toEqual({
      restore: false,
      why: 'forgotten',
    });
    // No marker at all on the topic: Redis's generation alone.
    expect(restoreVerdict(copy({}), 0, 0, 1)).toEqual({ restore: false, why: 'forgotten' });
    // Lower than the topic's marker (Redis's key lost or deleted by hand): the marker's.
    expect(restoreVerdict(copy({ forgets: 1, forgotten: 2 }), 0, 0, 1)).toEqual({
      restore: false,
      why: 'forgotten',
    });
    expect(
      restoreVerdict(copy({ forgets: 2, forgotten: 1, ctxForgets: new Map([['x', 1]]) }), 0, 0, 2),
    ).toEqual({
      restore: true,
      leftMs: 0,
      ctxs: new Map(),
      stale: ['x'],
    });
  });

  it('as before for the rest: retired whatever the TTL, expired by its copy’s age at TTL > 0 only', () => {
    expect(restoreVerdict(copy({ retired: true, forgets: 1, forgotten: 1 }), 0, 0)).toEqual({
      restore: false,
      why: 'retired',
    });
    expect(restoreVerdict(copy({ at: 0 }), HOUR, HOUR)).toEqual({ restore: false, why: 'expired' });
    expect(restoreVerdict(copy({ at: 0 }), 0, 10 * HOUR)).toMatchObject({ restore: true, leftMs: 0 });
  });
});

describe('autoseq Lua scripts', () => {
  it('every Lua file of the scope scripts is registered, and every registered name has its file', () => {
    const files = readdirSync(SCRIPT_DIR).filter((f) => f.endsWith('.lua'));
    expect(files.map((f) => f.replace(/-(\d+|n)\.lua$/, '')).sort()).toEqual([...SCRIPTS].sort());
  });
});
