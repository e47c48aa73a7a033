import { v5 as uuidv5 } from 'uuid';
import { cutText } from '../../../../shared/core/text.js';
import {
  LIMITS,
  registeredFlowV1,
  type FlowCandidate,
  type FlowCandidateRecord,
  type FlowDefinition,
  type FlowStep,
  type RegisteredFlow,
  type RequestTerms,
} from '../../../../schemas/index.js';
import { Bm25Index } from './bm25.js';
import { learnInputs, type EvidenceRun } from './dataflow.js';
import { planOf } from './score.js';

/** Namespace of Paver flow ids (UUID v5): the same definition key always gives the same id. */
export const FLOW_NAMESPACE = '6f0e6a55-6d2f-5b6e-9c39-7061766572f1';
export const manualFlowId = (d: Pick<FlowDefinition, 'tenant_id' | 'agent_id' | 'name'>) =>
  uuidv5(`manual:${d.tenant_id}/${d.agent_id}/${d.name}`, FLOW_NAMESPACE);
/**
 * The id of the flow promoted from a candidate: its scope's, since two agents (or tenants) with the same tool
 * sequence have the same dedupe key, and one id for both made each promotion replace the other's flow on the
 * flows topic (keyed by id) and in every registry. JSON keeps ('a/b', 'c') apart from ('a', 'b/c').
 */
export const promotedFlowId = (tenant: string, agent: string, dedupeKey: string) =>
  uuidv5(`candidate:${JSON.stringify([tenant, agent, dedupeKey])}`, FLOW_NAMESPACE);
/**
 * The id versions before scoped ids gave a promoted flow (the dedupe key alone). Flows on the topic under such
 * an id stay as they are; a re-promotion in the same scope keeps using it (FlowsEngine), so that it replaces
 * that flow instead of adding a second one beside it.
 */
export const unscopedPromotedFlowId = (dedupeKey: string) => uuidv5(`candidate:${dedupeKey}`, FLOW_NAMESPACE);

export const scopeId = (tenant: string, agent: string) => `${tenant}\u001f${agent}`;

/** The text sparse retrieval sees: name, description, condition and desired effects. */
export const searchText = (f: RegisteredFlow) =>
  [f.name, f.description, f.condition, ...f.desired_effects].join('\n');

/** A flow's tools in step order, a loop counting as its tool ('' for a step without a skill). */
export const toolsOf = (f: RegisteredFlow) => planOf(f.steps).map((p) => p.tool);

/** One key per tool sequence (JSON per tool, so no tool name can make two sequences collide). */
const seqKey = (tools: readonly string[], n: number) => {
  let k = '';
  for (let i = 0; i < n; i++) k += (i ? ',' : '') + JSON.stringify(tools[i]);
  return k;
};

/**
 * The flows of a scope grouped by their exact tool sequence (flows with a skill-less step left out: they never
 * replace another), each group in registration order like the scope's own map. Prefix back-off asks, for a
 * recalled flow, for the shortest registered flow its steps begin with; a scan of the scope per recalled flow
 * was most of a recall at 10,000 flows, a lookup per prefix length is a handful of map reads.
 */
export class ToolSequenceIndex {
  private readonly bySeq = new Map<string, Map<string, RegisteredFlow>>();

  private static keyOf(f: RegisteredFlow): string | undefined {
    const tools = toolsOf(f);
    return tools.length === 0 || tools.includes('') ? undefined : seqKey(tools, tools.length);
  }

  add(f: RegisteredFlow): void {
    const k = ToolSequenceIndex.keyOf(f);
    if (k === undefined) return;
    let group = this.bySeq.get(k);
    if (!group) this.bySeq.set(k, (group = new Map()));
    group.set(f.id, f);
  }

  remove(f: RegisteredFlow): void {
    const k = ToolSequenceIndex.keyOf(f);
    const group = k === undefined ? undefined : this.bySeq.get(k);
    if (!group) return;
    group.delete(f.id);
    if (group.size === 0) this.bySeq.delete(k!);
  }

  /**
   * The first registered flow (other than `f`) of the shortest tool sequence that is a proper, non-empty prefix
   * of `f`'s, or undefined: the same answer as a scan of the scope in registration order keeping the first
   * shortest (`prefixOf` in select.ts), which the unit tests check against this.
   */
  shortestPrefix(f: RegisteredFlow): RegisteredFlow | undefined {
    const mine = toolsOf(f);
    if (mine.includes('')) return undefined;
    for (let n = 1; n < mine.length; n++) {
      const group = this.bySeq.get(seqKey(mine, n));
      if (!group) continue;
      for (const g of group.values()) if (g.id !== f.id) return g;
    }
    return undefined;
  }
}

class ScopeRegistry {
  readonly flows = new Map<string, RegisteredFlow>();
  readonly bm25 = new Bm25Index();
  readonly vectors = new Map<string, number[]>();
  readonly sequences = new ToolSequenceIndex();
}

/** Registered flows per (tenant, agent), with their sparse index and, when an embedder is configured, vectors. */
export class FlowRegistry {
  private readonly scopes = new Map<string, ScopeRegistry>();
  /** Where each id is: a flow's update or removal looks in its own scope, not in every one (quadratic on a load). */
  private readonly scopeOfId = new Map<string, ScopeRegistry>();

  private scope(tenant: string, agent: string, create: true): ScopeRegistry;
  private scope(tenant: string, agent: string, create?: false): ScopeRegistry | undefined;
  private scope(tenant: string, agent: string, create = false) {
    const k = scopeId(tenant, agent);
    let s = this.scopes.get(k);
    if (!s && create) this.scopes.set(k, (s = new ScopeRegistry()));
    return s;
  }

  upsert(f: RegisteredFlow): void {
    // The same id may move scope only by a bug upstream; remove it everywhere first so it is never listed twice.
    const was = this.scopeOfId.get(f.id);
    const old = was?.flows.get(f.id);
    const vector = was?.vectors.get(f.id);
    this.remove(f.id);
    const s = this.scope(f.tenant_id, f.agent_id, true);
    s.flows.set(f.id, f);
    this.scopeOfId.set(f.id, s);
    const text = searchText(f);
    s.bm25.add(f.id, text);
    s.sequences.add(f);
    // A flow published again unchanged (every start publishes the hand-written ones, and every instance reads
    // them) keeps its embedding: one embedding call per flow and instance at each start otherwise.
    if (vector && old && searchText(old) === text) s.vectors.set(f.id, vector);
  }
  remove(id: string): RegisteredFlow | undefined {
    const s = this.scopeOfId.get(id);
    const f = s?.flows.get(id);
    if (!s || !f) return undefined;
    this.scopeOfId.delete(id);
    s.flows.delete(id);
    s.bm25.remove(id);
    s.sequences.remove(f);
    s.vectors.delete(id);
    return f;
  }
  get(tenant: string, agent: string, id: string): RegisteredFlow | undefined {
    return this.scope(tenant, agent)?.flows.get(id);
  }
  list(tenant: string, agent: string): RegisteredFlow[] {
    return [...(this.scope(tenant, agent)?.flows.values() ?? [])];
  }
  setVector(tenant: string, agent: string, id: string, v: number[]): void {
    this.scope(tenant, agent)?.vectors.set(id, v);
  }
  missingVectors(): RegisteredFlow[] {
    return [...this.scopes.values()].flatMap((s) =>
      [...s.flows.values()].filter((f) => !s.vectors.has(f.id)),
    );
  }
  index(
    tenant: string,
    agent: string,
  ):
    | {
        bm25: Bm25Index;
        vectors: Map<string, number[]>;
        flows: Map<string, RegisteredFlow>;
        sequences: ToolSequenceIndex;
      }
    | undefined {
    return this.scope(tenant, agent);
  }
  /** Every flow of every scope. */
  all(): RegisteredFlow[] {
    return [...this.scopes.values()].flatMap((s) => [...s.flows.values()]);
  }
  get size(): number {
    let n = 0;
    for (const s of this.scopes.values()) n += s.flows.size;
    return n;
  }
}

export function registerManual(d: FlowDefinition, now: number): RegisteredFlow {
  return { ...d, id: d.id ?? manualFlowId(d), source: 'manual', registered_at: now };
}

/**
 * The hand-written flows as registered at a start: each keeps the `registered_at` the registry holds for its id,
 * the id it is given or the one `manualFlowId` makes (a flow written without an id was looked up under '', and
 * got a fresh time at every start).
 */
export function registerManualFlows(
  defs: readonly FlowDefinition[],
  registry: Pick<FlowRegistry, 'get'>,
  now: number,
): RegisteredFlow[] {
  return defs.map((d) =>
    registerManual(d, registry.get(d.tenant_id, d.agent_id, d.id ?? manualFlowId(d))?.registered_at ?? now),
  );
}

/**
 * The hand-written flows the registry holds that the flows file no longer defines: the file is the source of truth
 * for them, so a flow taken out of it is withdrawn at the next start (before, it stayed on the flows topic, and was
 * selected, for good). Compared by id, the flows topic's key.
 */
export function manualFlowsGone(
  file: readonly Pick<RegisteredFlow, 'id'>[],
  held: readonly RegisteredFlow[],
): RegisteredFlow[] {
  const keep = new Set(file.map((f) => f.id));
  return held.filter((f) => f.source === 'manual' && !keep.has(f.id));
}

/** Request terms most frequent first (ties by term), each once: how often a term occurred lives in `df`, not in repetition. */
export function requestWords(rt: RequestTerms | undefined, max = 24): string[] {
  if (!rt) return [];
  return [...rt.terms]
    .sort((a, b) => b.df - a.df || (a.term < b.term ? -1 : a.term > b.term ? 1 : 0))
    .slice(0, max)
    .map((t) => t.term);
}

/** Longest loop body recognised: longer repeated blocks stay as they are. */
export const MAX_LOOP_BODY = 3;

/**
 * A looping sub-sequence (one tool, or a block of up to MAX_LOOP_BODY tools, repeated consecutively) as ONE
 * loop: the block once, its first step carrying `for_each` (list unknown here: `over: null`). How often an
 * agent repeats a lookup differs from run to run; a copy per repetition seen would propose the wrong count.
 * Returns the kept steps (original objects) with the loop length of each (undefined: not a loop).
 */
export function loopsOf<S extends { skill_key?: unknown }>(
  steps: readonly S[],
): { step: S; body?: number }[] {
  const key = (s: S) => (typeof s.skill_key === 'string' ? s.skill_key : '');
  const out: { step: S; body?: number }[] = [];
  const same = (a: number, b: number, k: number) => {
    for (let j = 0; j < k; j++)
      if (key(steps[a + j]!) !== key(steps[b + j]!) || !key(steps[a + j]!)) return false;
    return true;
  };
  for (let i = 0; i < steps.length;) {
    let loop = 0;
    let reps = 0;
    for (let k = 1; k <= MAX_LOOP_BODY && !loop; k++) {
      let r = 1;
      while (i + (r + 1) * k <= steps.length && same(i, i + r * k, k)) r++;
      if (r >= 2) [loop, reps] = [k, r];
    }
    if (!loop) {
      out.push({ step: steps[i]! });
      i++;
      continue;
    }
    for (let j = 0; j < loop; j++)
      out.push(j === 0 ? { step: steps[i]!, body: loop } : { step: steps[i + j]! });
    i += loop * reps;
  }
  return out;
}

/**
 * The steps of a flow proposed for a tool sequence: loops collapsed (see loopsOf), ids renumbered, each step
 * depending on the one before, ending with the first loop over an unknown list. With past runs (`evidence`),
 * `input_map` is learned from data flow (core/dataflow.ts); without, no argument is bound (`inputs:
 * 'unknown'`): a chain guess would hand a step an output it never consumed.
 */
export function stepsOf(steps: readonly FlowStep[], evidence?: readonly EvidenceRun[]): FlowStep[] {
  const out = collapsedSteps(steps);
  const learned = evidence?.length ? learnInputs(out, evidence) : out;
  // A loop over a list the flow cannot name runs as often as the run needs, which the flow cannot know: it
  // cannot tell when the loop ends, so it proposes nothing after it (the agent takes over). Measured on the
  // dev data: the step after such a loop was the flows' most frequent wrong step.
  const open = learned.findIndex((s) => s.for_each && s.for_each.over === null);
  return open < 0 ? learned : learned.slice(0, open + (learned[open]!.for_each!.body ?? 1));
}

/** Loops collapsed (loopsOf), ids renumbered, each step after the one before, no argument bound. */
export function collapsedSteps(steps: readonly FlowStep[]): FlowStep[] {
  return loopsOf(steps).map(({ step, body }, i): FlowStep => {
    const { for_each: _f, inputs: _i, unbound: _u, ...rest } = step;
    return {
      ...rest,
      id: `step_${i + 1}`,
      depends_on: i === 0 ? [] : [`step_${i}`],
      output_key: `step_${i + 1}`,
      input_map: {},
      inputs: 'unknown' as const,
      ...(body !== undefined ? { for_each: { over: null, body } } : {}),
    };
  });
}

/** flows.v1 bounds on a flow's texts (schemas/flows.v1.ts). */
export const FLOW_NAME_MAX = 256;
export const FLOW_EFFECT_MAX = 4096;

/**
 * Why a flow would be refused on the flows topic (the flows.v1 contract the sink checks), or null. Promotion asks
 * before it decides: a refusal there fails the sink's send as INTERNAL, fatal to the consumer, and a redelivery
 * of the same candidate fails again, for ever.
 */
export function flowViolations(f: RegisteredFlow): string | null {
  const r = registeredFlowV1.safeParse(f);
  if (r.success) return null;
  // Paths and messages only: a value may be payload (the detector's texts come from agents' requests).
  return r.error.issues
    .slice(0, 10)
    .map((i) => `${i.path.map(String).join('.') || '(root)'}: ${i.message}`)
    .join('; ');
}

/**
 * A promoted candidate as a flow: the proposed flow, its description and condition in the words of the
 * requests it served (when the candidate carries request terms), with the detector's prompt hint. Each tool
 * is named once in the condition so that a looping sequence does not weigh more than a straight one.
 */
export function flowFromCandidate(
  r: FlowCandidateRecord,
  now: number,
  evidence?: readonly EvidenceRun[],
  id = promotedFlowId(r.tenant_id, r.agent_id, r.dedupe_key),
): RegisteredFlow {
  const pf = r.promotion_effect?.proposed_flow ?? r.candidate?.proposed_flow;
  const tools = r.candidate?.tool_sequence ?? pf?.steps.map((s) => s.skill_key) ?? [];
  const distinct = [...new Set(tools)];
  const words = requestWords(r.candidate?.request_terms);
  const base = pf?.description ?? r.title;
  return {
    id,
    tenant_id: r.tenant_id,
    agent_id: r.agent_id,
    // The detector names a candidate after its whole tool sequence, which for a long one is past what a flow's
    // name may be; the start of it still tells flows apart, and the steps say the rest.
    name: cutText(pf?.name ?? r.title, FLOW_NAME_MAX),
    description: cutText(
      words.length ? `${base} Requests it served mention: ${words.join(', ')}.` : base,
      LIMITS.textLength,
    ),
    condition: cutText(
      words.length
        ? `Requests about ${words.join(', ')}; the agent handled them by running ${distinct.join(', ')}.`
        : `Requests the agent has handled by running ${distinct.join(', ')}.`,
      LIMITS.textLength,
    ),
    desired_effects: [r.title, ...(pf?.tags ?? [])].filter(Boolean).map((x) => cutText(x, FLOW_EFFECT_MAX)),
    steps: stepsOf(pf?.steps ?? [], evidence),
    ...(r.promotion_effect?.agent_prompt_hint
      ? { agent_prompt_hint: r.promotion_effect.agent_prompt_hint }
      : {}),
    source: 'promoted',
    dedupe_key: r.dedupe_key,
    registered_at: now,
  };
}

/** An offline candidate (`paver detect` output) as the record the detector would publish for it. */
export const recordOfCandidate = (
  c: FlowCandidate,
  scope: { tenant: string; agent: string },
  now: number,
): FlowCandidateRecord => ({
  schema_version: 1,
  status: 'active',
  tenant_id: scope.tenant,
  agent_id: scope.agent,
  dedupe_key: c.dedupe_key,
  detected_at: now,
  title: c.proposed_flow.name,
  source_kind: 'tool_sequence',
  occurrence_count: c.occurrence_count,
  estimated_token_savings: c.estimated_token_savings,
  candidate: c,
  promotion_effect: null,
});

/** A registered flow as the flows file gives it (id kept, so choices compare across runs). */
export const definitionOf = (f: RegisteredFlow): FlowDefinition => ({
  id: f.id,
  tenant_id: f.tenant_id,
  agent_id: f.agent_id,
  name: f.name,
  description: f.description,
  condition: f.condition,
  desired_effects: f.desired_effects,
  steps: f.steps,
  ...(f.agent_prompt_hint ? { agent_prompt_hint: f.agent_prompt_hint } : {}),
});

/** The flows the service would register for these candidates: the very function promotion calls, per candidate. */
export const flowsFromCandidates = (
  cands: readonly FlowCandidate[],
  scope: { tenant: string; agent: string },
  evidence?: readonly EvidenceRun[],
): FlowDefinition[] =>
  cands.map((c) => definitionOf(flowFromCandidate(recordOfCandidate(c, scope, 0), 0, evidence)));
