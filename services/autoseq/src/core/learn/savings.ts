import type { Proposal } from './learner.js';

/** What `paver savings` counts: only active proposals can save a step, so only they are in the rates. */
export interface Tally {
  tool_calls: number;
  active_proposals: number;
  hits: number;
  misses: number;
  shadow_proposals: number;
  shadow_hits: number;
}

const tally = (): Tally => ({
  tool_calls: 0,
  active_proposals: 0,
  hits: 0,
  misses: 0,
  shadow_proposals: 0,
  shadow_hits: 0,
});

export interface SavingsReport {
  overall: Tally & { coverage: number; precision: number | null };
  per_tool: Record<string, Tally & { coverage: number; precision: number | null }>;
  /** Per rule: `coverage` is its active hits ÷ all tool calls (a rule has no calls of its own). */
  per_rule: Record<string, Tally & { tool: string; coverage: number; precision: number | null }>;
}

/**
 * Accumulates outcomes of held proposals. Per tool counts the actual call's tool for `tool_calls` and the
 * proposed tool for proposals (a proposal of X that meets a call of Y is a miss of X). A task that ends with a
 * proposal held counts a miss.
 */
export class SavingsCounter {
  private readonly all = tally();
  private readonly tools = new Map<string, Tally>();
  private readonly rules = new Map<string, Tally & { tool: string }>();

  private tool(name: string): Tally {
    let t = this.tools.get(name);
    if (!t) this.tools.set(name, (t = tally()));
    return t;
  }

  /** `actual` is the tool of the call that came (null: the task ended). */
  add(actual: string | null, held: Proposal | null, hit: boolean | undefined): void {
    if (actual !== null) {
      this.all.tool_calls++;
      this.tool(actual).tool_calls++;
    }
    if (!held) return;
    const targets: Tally[] = [this.all, this.tool(held.tool)];
    const rid = held.rule_id ?? `typed:${held.tool}`;
    let r = this.rules.get(rid);
    if (!r) this.rules.set(rid, (r = { ...tally(), tool: held.tool }));
    targets.push(r);
    for (const t of targets) {
      if (held.state === 'active') {
        t.active_proposals++;
        if (hit) t.hits++;
        else t.misses++;
      } else {
        t.shadow_proposals++;
        if (hit) t.shadow_hits++;
      }
    }
  }

  report(): SavingsReport {
    const rates = (t: Tally) => ({
      ...t,
      coverage: t.tool_calls > 0 ? t.hits / t.tool_calls : 0,
      precision: t.active_proposals > 0 ? t.hits / t.active_proposals : null,
    });
    const sorted = <T>(m: Map<string, T>) =>
      [...m.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return {
      overall: rates(this.all),
      per_tool: Object.fromEntries(sorted(this.tools).map(([k, t]) => [k, rates(t)])),
      per_rule: Object.fromEntries(
        sorted(this.rules)
          .filter(([, t]) => t.active_proposals > 0)
          .map(([k, t]) => [
            k,
            {
              ...t,
              coverage: this.all.tool_calls > 0 ? t.hits / this.all.tool_calls : 0,
              precision: t.active_proposals > 0 ? t.hits / t.active_proposals : null,
            },
          ]),
      ),
    };
  }
}
