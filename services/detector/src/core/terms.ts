import type { RequestTerms } from '../../../../schemas/index.js';
import { codePointCompare } from './order.js';
export { MAX_TERMS_PER_MESSAGE, requestTermsOf } from '../../../../shared/core/terms.js';

/** Terms a candidate carries (the schema's bound). */
export const MAX_CANDIDATE_TERMS = 64;
/** Terms quoted in a proposed flow's description. */
export const DESCRIPTION_TERMS = 12;

/**
 * Term statistics over the records that contain a sequence: `terms` is null for a task whose first user
 * message was never seen (it does not count in `tasks`). Ordered by df desc, then term in code-point order.
 */
export function aggregateTerms(perTask: readonly (readonly string[] | null)[]): RequestTerms {
  const df = new Map<string, number>();
  let tasks = 0;
  for (const terms of perTask) {
    if (terms === null) continue;
    tasks++;
    for (const t of terms) df.set(t, (df.get(t) ?? 0) + 1);
  }
  const ranked = [...df]
    .sort(([a, x], [b, y]) => y - x || codePointCompare(a, b))
    .slice(0, MAX_CANDIDATE_TERMS)
    .map(([term, n]) => ({ term, df: n }));
  return { tasks, terms: ranked };
}
