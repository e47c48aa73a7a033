/** How a proposed flow fared against what the agent actually did (the replay's and the outcome scorer's unit). */
export interface Match {
  /** Steps the flow proposed: up to and including the first mismatch (0 when the flow never started). */
  proposed: number;
  /** Steps equal to the agent's calls, from its first call of the flow's first tool up to the first mismatch. */
  matched: number;
}

/**
 * The flow takes over where the agent first calls the flow's first tool (that step counts: the flow would
 * have run it) and proposes its steps in order; the first step that differs from the agent's next call is
 * proposed and wrong, and ends the flow. A flow whose first tool the agent never called never started.
 */
export function matchSteps(steps: readonly string[], calls: readonly string[]): Match {
  if (steps.length === 0) return { proposed: 0, matched: 0 };
  const start = calls.indexOf(steps[0]!);
  if (start < 0) return { proposed: 0, matched: 0 };
  let matched = 0;
  while (matched < steps.length && calls[start + matched] === steps[matched]) matched++;
  return { proposed: matched < steps.length ? matched + 1 : matched, matched };
}

export const precisionOf = (m: Match) => (m.proposed ? m.matched / m.proposed : 0);
