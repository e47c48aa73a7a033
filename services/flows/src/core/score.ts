/** How a proposed flow fared against what the agent actually did (the replay's and the outcome scorer's unit). */
export interface Match {
  /** Steps the flow proposed: up to and including the first mismatch (0 when the flow never started). */
  proposed: number;
  /** Steps equal to the agent's calls, from its first call of the flow's first tool up to the first mismatch. */
  matched: number;
}

/**
 * A flow's steps as the scorer sees them: one tool call each, or a loop (`body` = how many steps, this one
 * first, run once per element of a list).
 */
export interface PlanStep {
  tool: string;
  /** Set on the first step of a `for_each` loop: the length of its body. */
  body?: number;
}

type StepLike =
  string | PlanStep | { skill_key?: unknown; for_each?: { body?: number | undefined } | null | undefined };

/** Steps of a flow as a plan (hand-written steps without a skill never match a call). */
export function planOf(steps: readonly StepLike[]): PlanStep[] {
  return steps.map((s) => {
    if (typeof s === 'string') return { tool: s };
    // Flow steps always have a name; a hand-written one may carry any extra field, `tool` included.
    if ('tool' in s && !('name' in s)) return s as PlanStep;
    const step = s as { skill_key?: unknown; for_each?: { body?: number | undefined } | null };
    const tool = typeof step.skill_key === 'string' ? step.skill_key : '';
    return step.for_each ? { tool, body: Math.max(1, step.for_each.body ?? 1) } : { tool };
  });
}

/**
 * The flow takes over where the agent first calls the flow's first tool (that step counts: the flow would
 * have run it) and proposes its steps in order; the first step that differs from the agent's next call is
 * proposed and wrong, and ends the flow. A flow whose first tool the agent never called never started.
 *
 * A `for_each` loop runs once per element of its list, which only the run knows: offline it matches ONE OR
 * MORE consecutive repetitions of its body (as many complete repetitions as the agent made; each call
 * counts as a matched step). Its first repetition is scored like plain steps; a repetition the agent did not
 * complete is not proposed (the list ended), and the step after the loop is compared with the agent's next
 * call.
 */
export function matchSteps(steps: readonly StepLike[], calls: readonly string[]): Match {
  const plan = planOf(steps);
  if (plan.length === 0) return { proposed: 0, matched: 0 };
  const start = calls.indexOf(plan[0]!.tool);
  if (start < 0) return { proposed: 0, matched: 0 };
  let at = start;
  let matched = 0;
  const wrong = () => ({ proposed: matched + 1, matched });
  for (let i = 0; i < plan.length;) {
    const body = Math.min(plan[i]!.body ?? 1, plan.length - i);
    const tools = plan.slice(i, i + body).map((p) => p.tool);
    for (const t of tools) {
      if (calls[at] !== t) return wrong();
      at++;
      matched++;
    }
    if (plan[i]!.body !== undefined)
      while (at + body <= calls.length && tools.every((t, j) => calls[at + j] === t)) {
        at += body;
        matched += body;
      }
    i += body;
  }
  return { proposed: matched, matched };
}

export const precisionOf = (m: Match) => (m.proposed ? m.matched / m.proposed : 0);
