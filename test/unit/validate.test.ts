import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { CONTRACTS, toolCallsEventV1 } from '../../schemas/index.js';
import { accepts, checker, compile, faithful } from '../../shared/validate.js';
import { agentEvents } from '../../testkit/streams.js';

const zodOnly = (schema: z.ZodType) => (v: unknown) => {
  const r = schema.safeParse(v);
  return r.success ? { ok: true, value: r.data } : { ok: false };
};

/** Values around the tool-calls contract: valid events, and each field replaced by something near its limits. */
const awkward = fc.oneof(
  fc.string(),
  fc.string({ unit: 'grapheme', maxLength: 300 }),
  fc.constantFrom('', 'a\u0000b', 'x'.repeat(256), 'x'.repeat(257), '😀'.repeat(128), '😀'.repeat(129)),
  fc.integer(),
  fc.constantFrom(-1, 0, 1.5, 1e6, 1e6 + 1, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER + 2),
  fc.constant(null),
  fc.boolean(),
  fc.array(fc.string(), { maxLength: 3 }),
  fc.dictionary(fc.string(), fc.jsonValue(), { maxKeys: 3 }),
  fc.constant(undefined),
);
const FIELDS = [
  'type',
  'event_id',
  'ts',
  'tenant_id',
  'agent_id',
  'session_id',
  'task_id',
  'step',
  'tool',
  'args',
  'status',
  'side_effects',
  'cost_cents',
  'visible_tools',
  'origin',
  'pending_actions',
  'text',
  'episode_summaries',
  'unknown_field',
];
const base = [...agentEvents({ tasks: 50, seed: 7, agents: 2 })];
const events = fc
  .tuple(fc.constantFrom(...base), fc.array(fc.tuple(fc.constantFrom(...FIELDS), awkward), { maxLength: 3 }))
  .map(([e, edits]) => {
    const v: Record<string, unknown> = JSON.parse(JSON.stringify(e));
    for (const [k, x] of edits) {
      if (x === undefined) delete v[k];
      else v[k] = x;
    }
    return v;
  });

describe('compiled validators', () => {
  it('accept exactly what zod accepts and return what zod returns (tool-calls contract)', () => {
    const fast = compile(toolCallsEventV1)!;
    const slow = zodOnly(toolCallsEventV1);
    const check = checker(toolCallsEventV1);
    fc.assert(
      fc.property(events, (v) => {
        const want = slow(structuredClone(v));
        const got = fast(structuredClone(v));
        // Never more permissive than zod, and for this contract never stricter either (no slow fallback).
        expect(got ? { ok: true, value: got.value } : { ok: false }).toEqual(want);
        const answer = check(structuredClone(v));
        expect(answer.ok).toBe(want.ok);
        if (answer.ok) expect(JSON.stringify(answer.value)).toBe(JSON.stringify(want.value));
      }),
      { numRuns: 3000 },
    );
  });

  it('accept every valid event without falling back to zod', () => {
    const fast = compile(toolCallsEventV1)!;
    for (const e of base) expect(fast(JSON.parse(JSON.stringify({ ...e, extra: 1 })))).toBeDefined();
  });

  it('check outputs as zod does, for every contract', () => {
    for (const c of Object.values(CONTRACTS)) {
      const a = accepts(c.schema);
      fc.assert(
        fc.property(fc.jsonValue(), (v) => {
          expect(a(v)).toBe(c.schema.safeParse(v).success);
        }),
        { numRuns: 200 },
      );
    }
    const a = accepts(toolCallsEventV1);
    for (const e of base) expect(a(e)).toBe(true);
  });

  it('name the field in a refusal, in zod words', () => {
    const r = checker(toolCallsEventV1)({ ...base[0], session_id: 7 });
    expect(r.ok ? '' : r.detail).toMatch(/^session_id: /);
  });

  it('stay on zod for parts JSON Schema cannot say', () => {
    expect(faithful(z.string().refine((s) => s !== 'x'))).toBe(false);
    expect(faithful(z.string().transform((s) => s.length))).toBe(false);
    expect(faithful(z.string().regex(/^a$/i))).toBe(false);
    expect(faithful(z.string().email())).toBe(false);
    expect(faithful(z.object({ a: z.string().regex(/^a$/), n: z.number().int() }))).toBe(true);
    const refined = z.object({ a: z.string() }).superRefine((v, ctx) => {
      if (v.a === 'no') ctx.addIssue({ code: 'custom', message: 'no' });
    });
    expect(compile(refined)).toBeNull();
    expect(checker(refined)({ a: 'no' }).ok).toBe(false);
  });

  it('count string length and apply defaults as zod does', () => {
    const s = z.object({ k: z.string().max(4), d: z.string().default('x'), o: z.number().optional() });
    const f = compile(s)!;
    // zod counts code points, not UTF-16 units: 4 emoji (8 units) fit in max(4), 5 do not.
    expect(s.safeParse({ k: '😀😀😀😀' }).success).toBe(true);
    expect(f({ k: '😀😀😀😀😀' })).toBeUndefined();
    expect(f({ k: '😀😀😀😀', extra: true })).toEqual({ value: { k: '😀😀😀😀', d: 'x' } });
  });
});
