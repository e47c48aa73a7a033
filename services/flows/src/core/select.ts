import type { FlowSelectionRecord, RegisteredFlow } from '../../../../schemas/index.js';
import { byScore, cosine, rrf, type Scored } from './bm25.js';
import { parseIds } from './answer.js';
import type { PromptCache } from './prompt.js';
import { toolsOf, type FlowRegistry } from './registry.js';

export interface SelectPolicy {
  topK: number;
  rrfK: number;
  /** Below this fused score for the top candidate, no flow is chosen. 0 disables. */
  scoreFloor: number;
  /** On a model failure, choose nothing (the agent reasons as usual) instead of the top candidate. */
  failOpen: boolean;
  /** Summaries appended to the query for recall. */
  maxSummaries: number;
  /**
   * When past outcomes judged the candidates (similar past requests exist), a flow whose outcome score is not
   * above this is never chosen: past runs like this one say proposing it did not pay off.
   */
  outcomeFloor: number;
  /** Weight of the past-outcome ranking in the fusion (sparse and dense weigh 1 each). */
  outcomeWeight: number;
  /** A recalled flow that extends another registered flow of the scope is replaced by that flow (see `prefixOf`). */
  prefixBackoff: boolean;
}
export const DEFAULT_POLICY: SelectPolicy = {
  topK: 3,
  rrfK: 10,
  scoreFloor: 0,
  failOpen: false,
  maxSummaries: 3,
  outcomeFloor: 0,
  outcomeWeight: 1,
  prefixBackoff: true,
};

export interface Candidate {
  flow: RegisteredFlow;
  score: number;
  /** The past-outcome score, when similar past runs judged this flow. */
  outcome?: number;
}

/**
 * The shortest registered flow whose steps begin `f`'s (same tools in the same places, a loop counting as its
 * tool; at least one step fewer), or `f` itself. Why back off: a flow that extends another carries steps the
 * agents took in only some of the tasks the shorter one served, and those tasks' requests are a subset of the
 * shorter one's, so request terms cannot tell when the extra steps apply. On the dev data those extra steps
 * were most of the wrong steps (the bench in the README), while the shared steps were right.
 */
export function prefixOf(f: RegisteredFlow, flows: Iterable<RegisteredFlow>): RegisteredFlow {
  const mine = toolsOf(f);
  if (mine.some((t) => t === '')) return f;
  let best = f;
  let bestLen = mine.length;
  for (const g of flows) {
    if (g.id === f.id) continue;
    const theirs = toolsOf(g);
    if (theirs.length === 0 || theirs.length >= bestLen || theirs.some((t) => t === '')) continue;
    if (theirs.every((t, i) => t === mine[i])) [best, bestLen] = [g, theirs.length];
  }
  return best;
}

/** Above this many flows in a scope, only the sparse and dense recall lists are judged on past outcomes. */
const OUTCOME_ALL_FLOWS_MAX = 1_000;

export const augment = (query: string, summaries: readonly string[], max: number) =>
  [query, ...summaries.slice(-max)].join('\n');

/**
 * Stage 1: sparse (BM25), dense (when vectors are given) and past-outcome (when `outcomes` judges flows)
 * rankings fused by RRF; top_k of the fused list. Each ranking holds only documents it actually matched (a
 * positive BM25 score; the nearest vectors; a positive outcome score). When past outcomes judged a flow and
 * found it not above `outcomeFloor`, it is dropped: similar requests showed it does not pay off. With
 * `prefixBackoff`, a flow that extends another registered flow gives its place to that one (`prefixOf`).
 */
export function recall(
  reg: FlowRegistry,
  tenant: string,
  agent: string,
  query: string,
  summaries: readonly string[],
  p: SelectPolicy,
  queryVector?: number[] | null,
  outcomes?: (flows: readonly RegisteredFlow[]) => Map<string, number>,
): Candidate[] {
  const idx = reg.index(tenant, agent);
  if (!idx || idx.flows.size === 0) return [];
  const depth = Math.max(p.topK * 10, 50);
  const q = augment(query, summaries, p.maxSummaries);
  const rankings: string[][] = [idx.bm25.search(q, depth).map((s) => s.id)];
  if (queryVector && idx.vectors.size) {
    const dense: Scored[] = [];
    for (const [id, v] of idx.vectors) dense.push({ id, score: cosine(queryVector, v) });
    rankings.push(
      dense
        .sort((a, b) => b.score - a.score)
        .slice(0, depth)
        .map((s) => s.id),
    );
  }
  const weights: number[] = rankings.map(() => 1);
  let judged = new Map<string, number>();
  if (outcomes) {
    const pool =
      idx.flows.size <= OUTCOME_ALL_FLOWS_MAX
        ? [...idx.flows.values()]
        : [...new Set(rankings.flat())].map((id) => idx.flows.get(id)!);
    judged = outcomes(pool);
    rankings.push(
      [...judged]
        .map(([id, score]) => ({ id, score }))
        .filter((s) => s.score > 0)
        .sort(byScore)
        .slice(0, depth)
        .map((s) => s.id),
    );
    weights.push(p.outcomeWeight);
  }
  const out: Candidate[] = [];
  const seen = new Set<string>();
  for (const s of rrf(rankings, p.rrfK, weights)) {
    if (out.length >= p.topK) break;
    if (judged.has(s.id) && judged.get(s.id)! <= p.outcomeFloor) continue;
    const recalled = idx.flows.get(s.id)!;
    // The replacement takes the place (and score) of the flow it shortens; a flow already listed is not repeated.
    const flow = p.prefixBackoff ? (idx.sequences.shortestPrefix(recalled) ?? recalled) : recalled;
    if (seen.has(flow.id)) continue;
    seen.add(flow.id);
    const o = judged.get(flow.id);
    out.push({
      flow,
      score: Number(s.score.toFixed(6)),
      ...(o === undefined ? {} : { outcome: Number(o.toFixed(6)) }),
    });
  }
  return out;
}

/** What stage 2 got from the model: nothing configured, an answer, or a failure (error, timeout, budget). */
export type ModelOutcome = { kind: 'none' } | { kind: 'answer'; text: string } | { kind: 'failed' };

export type Selection = Pick<
  FlowSelectionRecord,
  'path' | 'chosen' | 'chosen_prompts' | 'combined_prompt' | 'unresolved_ids' | 'candidates'
>;

/** Whether stage 2 needs the model at all (several candidates above the floor). */
export const needsModel = (cands: Candidate[], p: SelectPolicy) =>
  cands.length > 1 && (cands[0]?.score ?? 0) >= p.scoreFloor;

/** Stage 2: the fast path, the model's answer mapped back to the registry, or the fallback. */
export function choose(
  cands: Candidate[],
  model: ModelOutcome,
  p: SelectPolicy,
  prompts: PromptCache,
): Selection {
  const candidates = cands.map((c) => ({ id: c.flow.id, name: c.flow.name, score: c.score }));
  const result = (
    path: Selection['path'],
    chosen: RegisteredFlow[],
    unresolved: string[] = [],
  ): Selection => {
    const chosen_prompts = chosen.map((f) => prompts.get(f));
    return {
      path,
      chosen: chosen.map((f) => ({ id: f.id, name: f.name })),
      chosen_prompts,
      combined_prompt: chosen_prompts.join('\n'),
      unresolved_ids: unresolved,
      candidates,
    };
  };
  if (cands.length === 0) return result('none', []);
  if (cands[0]!.score < p.scoreFloor) return result('none', []);
  if (cands.length === 1) return result('fast_path', [cands[0]!.flow]);
  const fallback = (unresolved: string[] = []) =>
    p.failOpen ? result('fail_open', [], unresolved) : result('fallback', [cands[0]!.flow], unresolved);
  if (model.kind === 'none') return result('top_ranked', [cands[0]!.flow]);
  if (model.kind === 'failed') return fallback();
  const ids = parseIds(model.text);
  if (!ids || ids.length === 0) return fallback();
  // Only the candidates the model was shown can be chosen. Another id is one it made up, or one the request's
  // text put in its mouth ("answer [\"<id>\"]"): taken from the registry, as the reference does, it would let a
  // user's message pick any registered flow, past recall and the score floor.
  const shown = new Map(cands.map((c) => [c.flow.id, c.flow]));
  const chosen: RegisteredFlow[] = [];
  const unresolved: string[] = [];
  for (const id of ids) {
    const f = shown.get(id);
    if (f && !chosen.includes(f)) chosen.push(f);
    else if (!f) unresolved.push(id);
  }
  return chosen.length ? result('model', chosen, unresolved) : fallback(unresolved);
}
