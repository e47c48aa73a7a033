import type { RegisteredFlow, ToolCallsEvent } from '../../../../schemas/index.js';
import { requestTermsOf } from '../../../../shared/core/terms.js';
import { matchSteps, planOf, type PlanStep } from './score.js';
import { completedRuns } from './sessions.js';

/** One finished run as the outcome scorer keeps it: the terms of its first request and the tools it called. */
export interface PastRun {
  terms: string[];
  calls: string[];
}

export interface OutcomePolicy {
  /** Past runs kept per scope (oldest leave first). 0 turns the scorer off. */
  capacity: number;
  /** Most similar past runs a flow is judged on. */
  neighbours: number;
  /** A wrong step costs this many right ones (a proposal that derails the agent is worse than none). */
  wrongCost: number;
}
export const DEFAULT_OUTCOME_POLICY: OutcomePolicy = { capacity: 500, neighbours: 10, wrongCost: 4 };

/** Steps of a flow as the scorer sees them (tools and loops; a step without a skill never matches a call). */
export const flowTools = (f: Pick<RegisteredFlow, 'steps'>): PlanStep[] => planOf(f.steps);

/**
 * Past runs of one scope, newest last, bounded. Scores flows by how well their steps matched the past runs
 * whose first requests were most similar to this one (idf-weighted cosine over request terms). A flow that
 * was chosen and did not pay off scores low on the runs like the one it failed on, so it drops for similar
 * requests next time; this needs no record of what was chosen, since every flow is judged on every run.
 */
export class OutcomeMemory {
  private readonly runs: PastRun[] = [];
  private readonly df = new Map<string, number>();
  constructor(readonly capacity: number) {}

  get size(): number {
    return this.runs.length;
  }
  /** The runs held, oldest first (what is persisted and restored). */
  all(): readonly PastRun[] {
    return this.runs;
  }

  add(run: PastRun): void {
    if (this.capacity <= 0) return;
    const r = { terms: [...new Set(run.terms)], calls: run.calls.slice(0, 1_000) };
    this.runs.push(r);
    for (const t of r.terms) this.df.set(t, (this.df.get(t) ?? 0) + 1);
    while (this.runs.length > this.capacity) {
      for (const t of this.runs.shift()!.terms) {
        const n = (this.df.get(t) ?? 1) - 1;
        if (n > 0) this.df.set(t, n);
        else this.df.delete(t);
      }
    }
  }

  /** The `k` most similar past runs with a positive similarity, most similar first (ties: newest first). */
  neighbours(query: readonly string[], k: number): { run: PastRun; sim: number }[] {
    const n = this.runs.length;
    if (!n || !query.length) return [];
    const w = (t: string) => Math.log(1 + n / (this.df.get(t) ?? 0.5));
    const q = new Set(query);
    let qn = 0;
    for (const t of q) qn += w(t) ** 2;
    const out: { run: PastRun; sim: number; i: number }[] = [];
    this.runs.forEach((run, i) => {
      let dot = 0;
      let rn = 0;
      for (const t of run.terms) {
        const x = w(t) ** 2;
        rn += x;
        if (q.has(t)) dot += x;
      }
      if (dot > 0) out.push({ run, sim: dot / Math.sqrt(qn * rn), i });
    });
    return out
      .sort((a, b) => b.sim - a.sim || b.i - a.i)
      .slice(0, k)
      .map(({ run, sim }) => ({ run, sim }));
  }
}

/**
 * Per flow, the similarity-weighted mean utility of its steps over the neighbour runs: matched steps minus
 * `wrongCost` per wrong step, per run. Positive means proposing it on such requests paid off on balance.
 * Flows absent from the map had no neighbour to be judged on.
 */
export function outcomeScores(
  mem: OutcomeMemory | undefined,
  query: readonly string[],
  flows: readonly RegisteredFlow[],
  p: OutcomePolicy,
): Map<string, number> {
  const out = new Map<string, number>();
  if (!mem || p.capacity <= 0) return out;
  const near = mem.neighbours(query, p.neighbours);
  if (!near.length) return out;
  const total = near.reduce((s, x) => s + x.sim, 0);
  for (const f of flows) {
    const tools = flowTools(f);
    let u = 0;
    for (const { run, sim } of near) {
      const m = matchSteps(tools, run.calls);
      u += sim * (m.matched - p.wrongCost * (m.proposed - m.matched));
    }
    out.set(f.id, u / total);
  }
  return out;
}

/** Outcome memories per (tenant, agent). */
export class OutcomeBook {
  private readonly scopes = new Map<string, OutcomeMemory>();
  constructor(readonly policy: OutcomePolicy) {}
  memory(tenant: string, agent: string): OutcomeMemory | undefined {
    return this.scopes.get(`${tenant}\u001f${agent}`);
  }
  add(tenant: string, agent: string, run: PastRun): void {
    if (this.policy.capacity <= 0) return;
    const k = `${tenant}\u001f${agent}`;
    let m = this.scopes.get(k);
    if (!m) this.scopes.set(k, (m = new OutcomeMemory(this.policy.capacity)));
    m.add(run);
  }
  /** Every scope's runs, oldest first. */
  *entries(): Generator<{ tenant: string; agent: string; runs: readonly PastRun[] }> {
    for (const [k, m] of this.scopes) {
      const [tenant, agent] = k.split('\u001f') as [string, string];
      yield { tenant, agent, runs: m.all() };
    }
  }
  /** The scorer `recall` takes, for one request. */
  scorer(tenant: string, agent: string, query: string) {
    const mem = this.memory(tenant, agent);
    if (!mem?.size) return undefined;
    const q = requestTermsOf(query);
    return (flows: readonly RegisteredFlow[]) => outcomeScores(mem, q, flows, this.policy);
  }
}

/** Past runs for the outcome scorer, the last `max` the service would have recorded (see `completedRuns`). */
export function pastRunsOf(events: Iterable<ToolCallsEvent>, max: number): PastRun[] {
  return completedRuns(events, false)
    .slice(-max)
    .map(({ terms, calls }) => ({ terms, calls }));
}
