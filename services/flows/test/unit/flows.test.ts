import { describe, expect, it } from 'vitest';
import { flowDefinitionV1, type FlowCandidateRecord } from '../../../../schemas/index.js';
import { parseIds } from '../../src/core/answer.js';
import { Bm25Index, byScore, rrf, terms, type Scored } from '../../src/core/bm25.js';
import { rng } from '../../../../testkit/streams.js';
import {
  decide,
  inShadow,
  onCandidate,
  onShadowOutcome,
  type Decision,
  type PromotionPolicy,
  type StoredCandidate,
} from '../../src/core/promotion.js';
import { buildPrompt, PromptCache } from '../../src/core/prompt.js';
import { wilsonLower } from '../../../../shared/core/wilson.js';
import {
  flowFromCandidate,
  FlowRegistry,
  manualFlowId,
  promotedFlowId,
  registerManual,
  manualFlowsGone,
  registerManualFlows,
} from '../../src/core/registry.js';
import { choose, DEFAULT_POLICY, prefixOf, recall } from '../../src/core/select.js';

describe('BM25', () => {
  const idx = new Bm25Index();
  idx.add('refund', 'refund order money back customer');
  idx.add('balance', 'account balance money');
  idx.add('bill', 'pay bill invoice');
  it('ranks by term rarity and frequency; unmatched documents are absent', () => {
    const r = idx.search('money back for my order', 10);
    expect(r.map((x) => x.id)).toEqual(['refund', 'balance']);
    expect(r[0]!.score).toBeGreaterThan(r[1]!.score);
    expect(idx.search('weather', 10)).toEqual([]);
  });
  it('canonically equal text finds the same flow: composed (NFC) and combining (NFD) accents alike', () => {
    const i2 = new Bm25Index();
    i2.add('booking', 'Réservation café'.normalize('NFC'));
    i2.add('other', 'invoice');
    for (const q of ['réservation café'.normalize('NFC'), 'réservation café'.normalize('NFD')])
      expect(i2.search(q, 5).map((x) => x.id)).toEqual(['booking']);
  });
  it('removes and re-adds incrementally', () => {
    const i2 = new Bm25Index();
    i2.add('a', 'alpha beta');
    i2.add('b', 'beta gamma');
    i2.remove('a');
    expect(i2.search('alpha', 5)).toEqual([]);
    i2.add('b', 'delta');
    expect(i2.search('beta', 5)).toEqual([]);
    expect(i2.search('delta', 5).map((x) => x.id)).toEqual(['b']);
    expect(i2.size).toBe(1);
  });
  it('after any churn of adds, re-adds and removals, ranks exactly as BM25 over the live documents', () => {
    // Reference: score every live document from scratch (binary tf, k1 1.2, b 0.75), best first, ties by id.
    const reference = (docs: Map<string, string>, query: string, limit: number): Scored[] => {
      const k1 = 1.2;
      const b = 0.75;
      const bags = [...docs].map(([id, text]) => ({
        id,
        len: terms(text).length,
        set: new Set(terms(text)),
      }));
      const avg = bags.reduce((s, d) => s + d.len, 0) / bags.length || 1;
      const qs = [...new Set(terms(query))];
      const out: Scored[] = [];
      for (const d of bags) {
        let score = 0;
        for (const t of qs) {
          if (!d.set.has(t)) continue;
          const df = bags.filter((x) => x.set.has(t)).length;
          const idf = Math.log(1 + (bags.length - df + 0.5) / (df + 0.5));
          score += (idf * (k1 + 1)) / (1 + k1 * (1 - b + (b * d.len) / avg));
        }
        if (score > 0) out.push({ id: d.id, score });
      }
      return out.sort(byScore).slice(0, limit);
    };
    const words = 'alpha beta gamma delta epsilon zeta eta theta iota kappa'.split(' ');
    const r = rng(7);
    const pick = (n: number) =>
      Array.from({ length: n }, () => words[Math.floor(r() * words.length)]).join(' ');
    const idx = new Bm25Index();
    const live = new Map<string, string>();
    for (let step = 0; step < 600; step++) {
      const id = `d${Math.floor(r() * 40)}`;
      if (r() < 0.3) {
        idx.remove(id);
        live.delete(id);
      } else {
        const text = pick(1 + Math.floor(r() * 6));
        idx.add(id, text);
        live.set(id, text);
      }
      // After every change: what a search leaves cached must not outlive the next change (a document's norm).
      {
        const q = pick(3);
        const got = idx.search(q, 5);
        const want = reference(live, q, 5);
        expect(got.map((x) => x.id)).toEqual(want.map((x) => x.id));
        got.forEach((x, i) => expect(x.score).toBeCloseTo(want[i]!.score, 12));
      }
    }
    expect(idx.size).toBe(live.size);
  });
  it('a document re-added with another length is scored by it, even when the average length comes back to one searched before', () => {
    // A shadow candidate's (or a re-published flow's) text changes with the detector's request terms: two flows
    // whose lengths swap leave the average where it was. The norms cached at that average were kept, each
    // document scored by the other's length, and the ranking came out inverted.
    const idx = new Bm25Index();
    idx.add('a', 'refund order');
    idx.add('b', 'refund order money back customer now');
    expect(idx.search('refund', 5).map((x) => x.id)).toEqual(['a', 'b']);
    idx.add('a', 'refund order money back customer now');
    idx.add('b', 'refund order');
    const fresh = new Bm25Index();
    fresh.add('a', 'refund order money back customer now');
    fresh.add('b', 'refund order');
    expect(idx.search('refund', 5)).toEqual(fresh.search('refund', 5));
    expect(idx.search('refund', 5).map((x) => x.id)).toEqual(['b', 'a']);
  });
  it('splits snake_case and is case-insensitive', () => {
    const i3 = new Bm25Index();
    i3.add('x', 'Web_Search then HTTP-get');
    expect(i3.search('web search http', 5)).toHaveLength(1);
  });
});

describe('reciprocal rank fusion', () => {
  it('sums 1/(k+rank) across rankings', () => {
    const r = rrf(
      [
        ['a', 'b', 'c'],
        ['b', 'a'],
      ],
      10,
    );
    expect(r.map((x) => x.id)).toEqual(['a', 'b', 'c']);
    expect(r[0]!.score).toBeCloseTo(1 / 11 + 1 / 12);
    expect(r[2]!.score).toBeCloseTo(1 / 13);
  });
  it('a document first in both beats one first in one', () => {
    expect(rrf([['x', 'y'], ['x']], 10)[0]).toEqual({ id: 'x', score: 2 / 11 });
  });
});

describe('model answer parser', () => {
  it.each([
    ['["a","b"]', ['a', 'b']],
    ['```json\n["a"]\n```', ['a']],
    ['```\n[ "a" , "b" ]\n```', ['a', 'b']],
    ['Sure! The best flows are ["a", "b"]. Let me know.', ['a', 'b']],
    ['[{"id":"a"},{"id":"b"}]', ['a', 'b']],
    ['{"ids":["a"]}', ['a']],
    ['["a","a"]', ['a']],
    ['[]', []],
    ['I think flow a fits best.', null],
    ['', null],
    ['[a, b]', null],
    ['{"choice": "a"}', null],
    ['["a", 3]', null],
    ['Candidates considered: [1 of 3]. Answer: ["b"]', ['b']],
  ])('%j → %j', (answer, want) => expect(parseIds(answer)).toEqual(want));
});

const def = (name: string, description: string, condition = '', effects: string[] = []) =>
  registerManual(flowDefinitionV1.parse({ name, description, condition, desired_effects: effects }), 1);
function registry() {
  const reg = new FlowRegistry();
  for (const f of [
    def('refund_order', 'Refund an order', 'user asks for a refund or money back', ['order refunded']),
    def('check_balance', 'Show the account balance', 'user asks how much money they have'),
    def('pay_bill', 'Pay a bill', 'user wants to pay an invoice', ['bill paid']),
  ])
    reg.upsert(f);
  return reg;
}

describe('selection', () => {
  const reg = registry();
  const prompts = new PromptCache();
  const ids = (name: string) => reg.list('default', 'default').find((f) => f.name === name)!.id;

  it('recall uses the summaries to resolve a vague request', () => {
    expect(recall(reg, 'default', 'default', 'help me with that', [], DEFAULT_POLICY)).toEqual([]);
    const c = recall(
      reg,
      'default',
      'default',
      'help me with that',
      ['the user wanted to pay an invoice'],
      DEFAULT_POLICY,
    );
    expect(c[0]!.flow.name).toBe('pay_bill');
  });
  it('fast path with one candidate: no model', () => {
    const c = recall(reg, 'default', 'default', 'refund please', [], DEFAULT_POLICY);
    expect(c).toHaveLength(1);
    expect(choose(c, { kind: 'failed' }, DEFAULT_POLICY, prompts)).toMatchObject({
      path: 'fast_path',
      chosen: [{ name: 'refund_order' }],
    });
  });
  const several = () => recall(reg, 'default', 'default', 'money refund balance bill', [], DEFAULT_POLICY);
  it('model path: several flows, ids mapped back to the registry, unknown ids reported', () => {
    const s = choose(
      several(),
      { kind: 'answer', text: `["${ids('pay_bill')}", "ghost-id", "${ids('check_balance')}"]` },
      DEFAULT_POLICY,
      prompts,
    );
    expect(s.path).toBe('model');
    expect(s.chosen.map((c) => c.name)).toEqual(['pay_bill', 'check_balance']);
    expect(s.unresolved_ids).toEqual(['ghost-id']);
    expect(s.combined_prompt).toBe(s.chosen_prompts.join('\n'));
  });
  it('model path: only the candidates the model was shown can be chosen; a registered flow recall did not find is unresolved', () => {
    // Recall showed two of the scope's flows.
    const c = several().slice(0, 2);
    const outside = reg.list('default', 'default').find((f) => !c.some((x) => x.flow.id === f.id))!;
    expect(c).toHaveLength(2);
    expect(outside).toBeDefined();
    const answer = `["${outside.id}", "${c[1]!.flow.id}", "${c[1]!.flow.id}"]`;
    const s = choose(c, { kind: 'answer', text: answer }, DEFAULT_POLICY, prompts);
    expect(s).toMatchObject({ path: 'model', chosen: [{ id: c[1]!.flow.id }], unresolved_ids: [outside.id] });
    expect(s.chosen_prompts).toHaveLength(1);
    // Named alone, it is no answer at all: the fallback decides.
    expect(choose(c, { kind: 'answer', text: `["${outside.id}"]` }, DEFAULT_POLICY, prompts)).toMatchObject({
      path: 'fallback',
      chosen: [{ id: c[0]!.flow.id }],
      unresolved_ids: [outside.id],
    });
  });
  it('fallback to the top-ranked on an unusable answer, an error, or no model; fail_open chooses nothing', () => {
    const c = several();
    for (const m of [
      { kind: 'answer' as const, text: 'no idea' },
      { kind: 'answer' as const, text: '[]' },
      { kind: 'failed' as const },
    ]) {
      expect(choose(c, m, DEFAULT_POLICY, prompts)).toMatchObject({
        path: 'fallback',
        chosen: [{ id: c[0]!.flow.id }],
      });
    }
    expect(choose(c, { kind: 'failed' }, { ...DEFAULT_POLICY, failOpen: true }, prompts)).toMatchObject({
      path: 'fail_open',
      chosen: [],
    });
    expect(choose(c, { kind: 'answer', text: '["ghost"]' }, DEFAULT_POLICY, prompts)).toMatchObject({
      path: 'fallback',
      unresolved_ids: ['ghost'],
    });
    // No model configured is not a failure: the path says what decided.
    expect(choose(c, { kind: 'none' }, DEFAULT_POLICY, prompts)).toMatchObject({
      path: 'top_ranked',
      chosen: [{ id: c[0]!.flow.id }],
    });
  });
  it('a top score under the floor, or no candidate, chooses nothing', () => {
    expect(
      choose(several(), { kind: 'none' }, { ...DEFAULT_POLICY, scoreFloor: 0.5 }, prompts),
    ).toMatchObject({ path: 'none', chosen: [] });
    expect(choose([], { kind: 'none' }, DEFAULT_POLICY, prompts).path).toBe('none');
  });
  it('top_k bounds the candidates', () => {
    expect(
      recall(reg, 'default', 'default', 'money refund balance bill', [], { ...DEFAULT_POLICY, topK: 2 }),
    ).toHaveLength(2);
  });
});

describe('prefix back-off', () => {
  const flow = (name: string, description: string, steps: (string | { loop: string })[]) =>
    registerManual(
      flowDefinitionV1.parse({
        name,
        description,
        steps: steps.map((t, i) =>
          typeof t === 'string'
            ? { name: `s${i}`, skill_key: t }
            : {
                id: `s${i}`,
                name: `s${i}`,
                skill_key: t.loop,
                depends_on: [],
                output_key: `o${i}`,
                retry_max: 0,
                retry_backoff: 0,
                timeout_seconds: 30,
                on_failure: 'stop',
                input_map: {},
                for_each: { over: null, body: 1 },
              },
        ),
      }),
      1,
    );
  const lookup = flow('lookup', 'look up a booking', [{ loop: 'get_booking' }]);
  const change = flow('change', 'change a booking to another date', ['get_booking', 'search', 'update']);
  const other = flow('other', 'change the address on file', ['get_profile', 'update']);
  const reg = new FlowRegistry();
  for (const f of [lookup, change, other]) reg.upsert(f);

  it('a flow that extends a registered one gives its place to it (a loop counts as its tool)', () => {
    const on = recall(reg, 'default', 'default', 'change my booking date', [], DEFAULT_POLICY);
    expect(on[0]!.flow.name).toBe('lookup');
    // Listed once, though both it and its extension were recalled.
    expect(on.filter((c) => c.flow.name === 'lookup')).toHaveLength(1);
    const off = recall(reg, 'default', 'default', 'change my booking date', [], {
      ...DEFAULT_POLICY,
      prefixBackoff: false,
    });
    expect(off[0]!.flow.name).toBe('change');
  });
  it('only a proper prefix of the same tools replaces a flow', () => {
    expect(prefixOf(other, reg.list('default', 'default')).name).toBe('other');
    expect(prefixOf(lookup, reg.list('default', 'default')).name).toBe('lookup');
    const unnamed = flow('manual', 'no skills', ['x']);
    const stepless = registerManual(flowDefinitionV1.parse({ name: 'bare', steps: [{ name: 'talk' }] }), 1);
    expect(prefixOf(unnamed, [stepless]).name).toBe('manual');
  });
  it("the registry's sequence index answers as a scan of the scope in registration order, through churn", () => {
    const r = rng(11);
    const tools = ['a', 'b', 'c'];
    const steps = () =>
      Array.from({ length: Math.floor(r() * 4) }, () =>
        r() < 0.1 ? { loop: tools[Math.floor(r() * 3)]! } : r() < 0.05 ? '' : tools[Math.floor(r() * 3)]!,
      );
    const seqs = new FlowRegistry();
    let compared = 0;
    let replaced = 0;
    for (let step = 0; step < 400; step++) {
      const name = `f${Math.floor(r() * 30)}`;
      if (r() < 0.2) seqs.remove(manualFlowId({ tenant_id: 'default', agent_id: 'default', name }));
      else
        seqs.upsert(
          registerManual(
            flowDefinitionV1.parse({
              name,
              steps: steps().map((t, i) =>
                typeof t === 'string'
                  ? t
                    ? { name: `s${i}`, skill_key: t }
                    : { name: `s${i}` }
                  : { name: `s${i}`, skill_key: t.loop, for_each: { over: null, body: 1 } },
              ),
            }),
            1,
          ),
        );
      const idx = seqs.index('default', 'default');
      for (const f of idx?.flows.values() ?? []) {
        const fast = idx!.sequences.shortestPrefix(f) ?? f;
        expect(fast.id).toBe(prefixOf(f, idx!.flows.values()).id);
        compared++;
        if (fast.id !== f.id) replaced++;
      }
    }
    // The property held over many flows, among them many that a shorter one replaced.
    expect(compared).toBeGreaterThan(1000);
    expect(replaced).toBeGreaterThan(100);
  });
});

describe('prompts and ids', () => {
  it('builds compact XML, escaped, cached per flow id and registration', () => {
    const f = def('a<b', 'x & "y"');
    expect(buildPrompt(f)).toBe(
      `<flow id="${f.id}" name="a&lt;b"><description>x &amp; &quot;y&quot;</description></flow>`,
    );
    const cache = new PromptCache();
    cache.get(f);
    cache.get(f);
    expect(cache.hits).toBe(1);
    cache.get({ ...f, registered_at: 2 });
    expect(cache.hits).toBe(1);
  });
  it('ids are deterministic UUID v5 of the definition key', () => {
    expect(manualFlowId({ tenant_id: 't', agent_id: 'a', name: 'n' })).toBe(
      manualFlowId({ tenant_id: 't', agent_id: 'a', name: 'n' }),
    );
    expect(manualFlowId({ tenant_id: 't', agent_id: 'a', name: 'n' })).not.toBe(
      manualFlowId({ tenant_id: 't', agent_id: 'b', name: 'n' }),
    );
    expect(promotedFlowId('default', 'default', 'k')).toMatch(/^[0-9a-f-]{36}$/);
  });
});

const cand = (over: Partial<FlowCandidateRecord> = {}): FlowCandidateRecord => ({
  schema_version: 1,
  status: 'active',
  tenant_id: 'default',
  agent_id: 'default',
  dedupe_key: 'k1',
  detected_at: 10,
  title: 'Search then summarize',
  source_kind: 'tool_sequence',
  occurrence_count: 12,
  estimated_token_savings: 30,
  candidate: null,
  promotion_effect: {
    effect_type: 'flow_offload_registration',
    proposed_flow: {
      name: 'flow_search',
      description: 'Search, then summarize',
      steps: [
        {
          id: 's1',
          name: 'Web Search',
          skill_key: 'web_search',
          depends_on: [],
          output_key: 'o1',
          retry_max: 1,
          retry_backoff: 1,
          timeout_seconds: 30,
          on_failure: 'stop',
          input_map: {},
        },
      ],
      tags: ['auto'],
    },
    agent_prompt_hint: 'Run flow_search',
    reason: 'seen 12 times',
  },
  ...over,
});

describe('promotion policy', () => {
  const manual: PromotionPolicy = {
    mode: 'manual',
    minOccurrences: 10,
    minSavings: 20,
    shadowTrials: 0,
    shadowPrecision: 0,
  };
  const auto: PromotionPolicy = { ...manual, mode: 'auto' };
  const next = (d: Decision) => (d.kind === 'ignore' ? null : d.next);
  const stored = (over: Partial<StoredCandidate> = {}): StoredCandidate => ({
    record: cand(),
    status: 'pending',
    retracted: false,
    decided_at: null,
    shadow_trials: 0,
    shadow_proposed: 0,
    shadow_matched: 0,
    ...over,
  });
  it('manual: pending; auto: promoted only above both thresholds', () => {
    expect(onCandidate(undefined, cand(), manual, 1)).toMatchObject({
      kind: 'store',
      next: { status: 'pending' },
    });
    expect(onCandidate(undefined, cand(), auto, 1)).toMatchObject({
      kind: 'promote',
      next: { status: 'promoted' },
    });
    expect(onCandidate(undefined, cand({ occurrence_count: 9 }), auto, 1).kind).toBe('store');
    expect(onCandidate(undefined, cand({ estimated_token_savings: 19 }), auto, 1).kind).toBe('store');
  });
  it('a rejected key is never proposed again; older records never overwrite newer ones', () => {
    const rejected = stored({ status: 'rejected', decided_at: 5 });
    expect(onCandidate(rejected, cand({ detected_at: 20, occurrence_count: 99 }), auto, 1)).toMatchObject({
      kind: 'store',
      next: { status: 'rejected' },
    });
    expect(onCandidate({ ...rejected, status: 'pending' }, cand({ detected_at: 5 }), auto, 1)).toEqual({
      kind: 'ignore',
      reason: 'stale',
    });
  });
  it('a retraction is recorded, not dropped; a promoted flow stays promoted and is marked retracted', () => {
    const pending = next(onCandidate(undefined, cand(), manual, 1))!;
    expect(
      next(onCandidate(pending, cand({ status: 'retracted', detected_at: 11 }), manual, 2)),
    ).toMatchObject({
      status: 'retracted',
      retracted: true,
    });
    const promoted = { ...pending, status: 'promoted' as const };
    expect(
      next(onCandidate(promoted, cand({ status: 'retracted', detected_at: 11 }), manual, 2)),
    ).toMatchObject({ status: 'promoted', retracted: true });
  });
  it('the record a retraction came after, delivered again, is stale: the candidate stays retracted, unpromoted', () => {
    // A batch read again (a restart, a rebalance) brings back the active record before the retraction. The
    // retraction kept the older record's detected_at, so the copy was not stale: it made the candidate pending
    // again and, under auto (a restart that turned it on, lowered its thresholds), promoted the retracted flow,
    // which the retraction read again then left promoted.
    const active = cand({ detected_at: 10 });
    const retracted = next(
      onCandidate(
        next(onCandidate(undefined, active, manual, 1))!,
        cand({ status: 'retracted', detected_at: 11 }),
        manual,
        2,
      ),
    )!;
    expect(retracted).toMatchObject({ status: 'retracted', retracted: true });
    // What it proposed is kept (the flow a promoted candidate carries, the title an operator reads).
    expect(retracted.record.candidate).toEqual(active.candidate);
    expect(onCandidate(retracted, active, auto, 3)).toEqual({ kind: 'ignore', reason: 'stale' });
    expect(retracted.record.detected_at).toBe(11);
    const promoted = next(
      onCandidate(
        { ...retracted, status: 'promoted' },
        cand({ status: 'retracted', detected_at: 12 }),
        manual,
        4,
      ),
    )!;
    expect(onCandidate(promoted, cand({ detected_at: 11 }), auto, 5)).toEqual({
      kind: 'ignore',
      reason: 'stale',
    });
    // A later proposal brings it back, as before.
    expect(onCandidate(retracted, cand({ detected_at: 13 }), auto, 6)).toMatchObject({ kind: 'promote' });
  });
  it('auto with shadow trials: promoted only after N shadow choices whose steps matched well enough', () => {
    const shadowed: PromotionPolicy = { ...auto, shadowTrials: 3, shadowPrecision: 0.5 };
    const first = onCandidate(undefined, cand(), shadowed, 1);
    expect(first.kind).toBe('store');
    expect(inShadow(next(first)!, shadowed)).toBe(true);
    let c = next(first)!;
    for (let i = 0; i < 2; i++) {
      const d = onShadowOutcome(c, { proposed: 4, matched: 4 }, shadowed, 2);
      expect(d.kind).toBe('store');
      c = next(d)!;
    }
    const third = onShadowOutcome(c, { proposed: 4, matched: 4 }, shadowed, 3);
    expect(third).toMatchObject({ kind: 'promote', next: { status: 'promoted', shadow_trials: 3 } });
    // Steps that kept missing keep it pending however many trials it gets.
    let bad = next(first)!;
    for (let i = 0; i < 10; i++) {
      const d = onShadowOutcome(bad, { proposed: 2, matched: 1 }, shadowed, 2);
      expect(d.kind).toBe('store');
      bad = next(d)!;
    }
    expect(bad).toMatchObject({
      status: 'pending',
      shadow_trials: 10,
      shadow_proposed: 20,
      shadow_matched: 10,
    });
    // A new version of the candidate keeps its shadow record.
    expect(next(onCandidate(bad, cand({ detected_at: 99 }), shadowed, 4))).toMatchObject({
      shadow_trials: 10,
    });
    // Manual promotion stays possible, whatever the shadow record says.
    expect(decide(bad, 'promote', 5)).toMatchObject({ kind: 'promoted', next: { status: 'promoted' } });
  });
  it('manual decisions: not found, conflicts, reject, promote', () => {
    expect(decide(undefined, 'promote', 1)).toEqual({ kind: 'not_found' });
    expect(decide(stored({ status: 'promoted' }), 'reject', 1)).toMatchObject({ kind: 'conflict' });
    expect(decide(stored({ status: 'rejected' }), 'promote', 1)).toMatchObject({ kind: 'conflict' });
    expect(decide(stored({ retracted: true, status: 'retracted' }), 'promote', 1)).toMatchObject({
      kind: 'conflict',
    });
    expect(decide(stored(), 'reject', 3)).toMatchObject({ kind: 'rejected', next: { decided_at: 3 } });
  });
  it('Wilson lower bound: 0 without trials, below the rate, closer with more trials', () => {
    expect(wilsonLower(0, 0)).toBe(0);
    expect(wilsonLower(9, 10)).toBeLessThan(0.9);
    expect(wilsonLower(90, 100)).toBeGreaterThan(wilsonLower(9, 10));
  });
  it('a promoted candidate becomes a flow with its prompt hint and a deterministic id', () => {
    const f = flowFromCandidate(cand(), 7);
    expect(f).toMatchObject({
      id: promotedFlowId('default', 'default', 'k1'),
      name: 'flow_search',
      agent_prompt_hint: 'Run flow_search',
      source: 'promoted',
      dedupe_key: 'k1',
    });
    expect(buildPrompt(f)).toContain('<hint>Run flow_search</hint>');
  });
});

describe('the Wilson bound at 0 hits', () => {
  it('is never below 0, so a shadow precision of 0 promotes whatever the number of trials', () => {
    for (let n = 1; n <= 200; n++) expect(wilsonLower(0, n), `0 of ${n}`).toBeGreaterThanOrEqual(0);
    const policy: PromotionPolicy = {
      mode: 'auto',
      minOccurrences: 1,
      minSavings: 0,
      shadowTrials: 1,
      shadowPrecision: 0,
    };
    const cand = (proposed: number): StoredCandidate => ({
      record: {
        status: 'active',
        occurrence_count: 5,
        estimated_token_savings: 1,
        detected_at: 1,
        candidate: {},
      } as unknown as StoredCandidate['record'],
      status: 'pending',
      retracted: false,
      decided_at: null,
      shadow_trials: 0,
      shadow_proposed: proposed,
      shadow_matched: 0,
    });
    // 0 of 15 and 0 of 31 gave about -1e-17.
    for (const proposed of [13, 14, 30])
      expect(onShadowOutcome(cand(proposed), { proposed: 1, matched: 0 }, policy, 0).kind).toBe('promote');
  });
});

describe('hand-written flows at a start', () => {
  it('keep the registered_at the registry holds, also when written without an id', () => {
    const withId = flowDefinitionV1.parse({
      id: '1b4e28ba-2fa1-41d2-883f-0016d3cca427',
      name: 'refund',
      description: 'd',
      condition: 'c',
    });
    const noId = flowDefinitionV1.parse({ name: 'exchange', description: 'd', condition: 'c' });
    const registry = new FlowRegistry();
    for (const f of registerManualFlows([withId, noId], registry, 100)) registry.upsert(f);
    // The next start: before, the flow without an id was looked up under '' and got the new time.
    expect(registerManualFlows([withId, noId], registry, 999).map((f) => [f.name, f.registered_at])).toEqual([
      ['refund', 100],
      ['exchange', 100],
    ]);
    const fresh = flowDefinitionV1.parse({ name: 'new', description: 'd', condition: 'c' });
    expect(registerManualFlows([fresh], registry, 999)[0]!.registered_at).toBe(999);
  });

  it('are withdrawn once the file no longer defines them; promoted flows are not the file’s to withdraw', () => {
    const def = (name: string) => flowDefinitionV1.parse({ name, description: 'd', condition: 'c' });
    const registry = new FlowRegistry();
    for (const f of registerManualFlows([def('refund'), def('exchange')], registry, 100)) registry.upsert(f);
    const promoted = { ...registerManual(def('promoted'), 100), source: 'promoted' as const };
    registry.upsert(promoted);
    const file = registerManualFlows([def('refund')], registry, 200);
    expect(manualFlowsGone(file, registry.all()).map((f) => f.name)).toEqual(['exchange']);
    expect(
      manualFlowsGone([], registry.all())
        .map((f) => f.name)
        .sort(),
    ).toEqual(['exchange', 'refund']);
  });
});
