import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { liveCandidates } from '../../src/core/detect.js';
import { toOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS, type DetectorParams } from '../../src/core/params.js';
import { DetectorState } from '../../src/core/state.js';
import { requestTermsOf } from '../../src/core/terms.js';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { toolCallsEventV1 } from '../../../../schemas/index.js';
import { batchDetect, type BatchRecord } from '../reference/batch.js';

/** mulberry32: the stream is derived from a seed fast-check chooses (and shrinks). */
function rng(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Gen {
  seed: number;
  tasks: number;
  alphabet: number;
  maxLen: number;
  concurrency: number;
  redeliver: number;
  scopes: number;
}

// Request words: content words, stop words, numbers, ids, emails, codes and punctuation, as users write.
const WORDS = [
  'exchange',
  'keyboard',
  'refund',
  'cancel',
  'Reservation',
  'flight',
  'baggage',
  'the',
  'I',
  'want',
  'to',
  "I'd",
  'please',
  'Hi!',
  'round-trip',
  'ABC123',
  'user_42',
  'mia.li@example.com',
  '2024',
  'ZXQWRT',
  'orderId',
  'ünïcode',
  'refund,',
];

/** Interleaved tasks over a few scopes, with repeated motifs, redeliveries, late events and mixed costs. */
function makeStream(g: Gen): {
  events: ToolCallsEvent[];
  truth: Map<
    string,
    { scope: string; tools: string[]; costs: (number | undefined)[]; terms: string[] | null }
  >;
} {
  const r = rng(g.seed);
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)]!;
  const tools = Array.from({ length: g.alphabet }, (_, i) => `tool_${String.fromCharCode(97 + i)}`);
  const motifs = Array.from({ length: 3 }, () =>
    Array.from({ length: 3 + Math.floor(r() * 4) }, () => pick(tools)),
  );
  const events: ToolCallsEvent[] = [];
  const truth = new Map<
    string,
    { scope: string; tools: string[]; costs: (number | undefined)[]; terms: string[] | null }
  >();
  const sentence = () => Array.from({ length: 1 + Math.floor(r() * 8) }, () => pick(WORDS)).join(' ');
  let ts = 1_000;
  let nextTask = 0;
  const active: {
    id: string;
    scope: string;
    plan: { tool: string; cost: number | undefined }[];
    step: number;
  }[] = [];
  const sent: ToolCallsEvent[] = [];
  while (nextTask < g.tasks || active.length > 0) {
    while (active.length < g.concurrency && nextTask < g.tasks) {
      const len = Math.floor(r() * (g.maxLen + 1));
      const plan: { tool: string; cost: number | undefined }[] = [];
      while (plan.length < len) {
        // Coarse costs (often absent = 1) so that savings tie and the tie-breaks are exercised.
        const cost = () => (r() < 0.6 ? undefined : pick([0.5, 1, 2, 1.25]));
        if (r() < 0.7) for (const t of pick(motifs)) plan.push({ tool: t, cost: cost() });
        else plan.push({ tool: pick(tools), cost: cost() });
      }
      plan.length = Math.min(plan.length, len);
      const id = `task-${nextTask++}`;
      const scope = `agent${Math.floor(r() * g.scopes)}`;
      active.push({ id, scope, plan, step: 0 });
      let terms: string[] | null = null;
      if (r() < 0.8) {
        // The task's first user message; a later one (below) must not replace its terms.
        const text = sentence();
        terms = requestTermsOf(text);
        ts += 1;
        events.push(
          toolCallsEventV1.parse({
            ts,
            tenant_id: 'acme',
            agent_id: scope,
            session_id: `sess-${id}`,
            task_id: id,
            type: 'user_message',
            event_id: `${id}-m0`,
            text,
          }),
        );
      }
      truth.set(id, { scope, tools: plan.map((p) => p.tool), costs: plan.map((p) => p.cost), terms });
    }
    const t = active[Math.floor(r() * active.length)]!;
    ts += 1 + Math.floor(r() * 3);
    const base = { ts, tenant_id: 'acme', agent_id: t.scope, session_id: `sess-${t.id}`, task_id: t.id };
    if (r() < 0.05) {
      const text = sentence();
      // Later messages count only for a task that had none before.
      const tr = truth.get(t.id)!;
      tr.terms ??= requestTermsOf(text);
      events.push(
        toolCallsEventV1.parse({
          ...base,
          type: 'user_message',
          event_id: `${t.id}-m${t.step + 1}`,
          text,
        }),
      );
    } else if (t.step < t.plan.length) {
      const s = t.plan[t.step]!;
      const e = toolCallsEventV1.parse({
        ...base,
        type: 'tool_call',
        event_id: `${t.id}-e${t.step}`,
        step: t.step,
        tool: s.tool,
        ...(s.cost === undefined ? {} : { cost_cents: s.cost }),
      });
      events.push(e);
      sent.push(e);
      t.step++;
    } else {
      events.push(toolCallsEventV1.parse({ ...base, type: 'task_completed', event_id: `${t.id}-done` }));
      active.splice(active.indexOf(t), 1);
      if (r() < 0.2) {
        // A late event for a finished task: must be ignored.
        events.push(
          toolCallsEventV1.parse({
            ...base,
            ts: ts + 1,
            type: 'tool_call',
            event_id: `${t.id}-late`,
            step: 999,
            tool: pick(tools),
          }),
        );
      }
    }
    if (sent.length > 0 && r() < g.redeliver) events.push({ ...pick(sent), ts: ts }); // Kafka redelivery: same event_id
  }
  return { events, truth };
}

const genArb = fc.record({
  seed: fc.integer(),
  tasks: fc.integer({ min: 1, max: 60 }),
  alphabet: fc.integer({ min: 2, max: 6 }),
  maxLen: fc.integer({ min: 0, max: 16 }),
  concurrency: fc.integer({ min: 1, max: 5 }),
  redeliver: fc.double({ min: 0, max: 0.3, noNaN: true }),
  scopes: fc.integer({ min: 1, max: 2 }),
});
const paramsArb = fc.record({
  minLength: fc.integer({ min: 2, max: 4 }),
  maxLength: fc.integer({ min: 4, max: 8 }),
  minOccurrences: fc.integer({ min: 2, max: 4 }),
  lookback: fc.integer({ min: 3, max: 25 }),
  maxCandidates: fc.integer({ min: 1, max: 6 }),
  windowMs: fc.option(fc.integer({ min: 20, max: 300 }), { nil: null }),
  requestTerms: fc.boolean(),
});

const stats = { compared: 0, nonEmpty: 0, ties: 0, withTerms: 0 };

describe('streaming detector core = batch reference', () => {
  it('gives the batch answer over the same window after every completed record', () => {
    fc.assert(
      fc.property(genArb, paramsArb, (g, pp) => {
        // Idle completion off here (every task completes explicitly); it has its own unit tests.
        const params: DetectorParams = { ...DEFAULT_PARAMS, ...pp, taskIdleMs: 1e12 };
        const { events, truth } = makeStream(g);
        const state = new DetectorState(params);
        const completed = new Map<string, BatchRecord[]>();
        const maxTs = new Map<string, number>();
        const done = new Set<string>();
        for (const e of events) {
          const op = toOp(e, params.requestTerms)!;
          state.apply(op);
          maxTs.set(e.agent_id, Math.max(maxTs.get(e.agent_id) ?? 0, e.ts));
          if (e.type === 'task_completed' && !done.has(e.task_id)) {
            done.add(e.task_id);
            const t = truth.get(e.task_id)!;
            const list = completed.get(t.scope) ?? [];
            list.push({ task: e.task_id, ts: e.ts, tools: t.tools, costs: t.costs, terms: t.terms });
            completed.set(t.scope, list);
          }
          if (e.type !== 'task_completed') continue;
          {
            const scope = e.agent_id;
            const sc = { tenant: 'acme', agent: scope };
            const live = liveCandidates(state.frequentStats(sc), params, state.windowRecords(sc));
            const streaming = live.map(({ proposed_flow: _p, ...c }) => c);
            for (const c of live) {
              for (const t of c.request_terms?.terms.slice(0, 12) ?? [])
                expect(c.proposed_flow.description).toContain(t.term);
              if (c.request_terms?.terms.length) stats.withTerms++;
            }
            const batch = batchDetect(completed.get(scope) ?? [], maxTs.get(scope) ?? 0, params);
            expect(streaming).toEqual(batch);
            stats.compared++;
            if (batch.length > 0) stats.nonEmpty++;
            if (
              batch.length > 1 &&
              batch.some(
                (c, i) => i > 0 && c.estimated_token_savings === batch[i - 1]!.estimated_token_savings,
              )
            )
              stats.ties++;
          }
        }
      }),
      { numRuns: 120 },
    );
    // The property must bite: many comparisons see candidates, and ties exercise the tie-breaks. The bounds
    // sit well under what random seeds give (nonEmpty 24-36% of comparisons, withTerms 20-55%, ties 38+ in
    // 14 runs), so they catch a vacuous generator without failing on an unlucky seed.
    expect(stats.nonEmpty).toBeGreaterThan(stats.compared / 8);
    expect(stats.ties).toBeGreaterThan(10);
    expect(stats.withTerms).toBeGreaterThan(stats.compared / 20);
  }, 120_000);
});
