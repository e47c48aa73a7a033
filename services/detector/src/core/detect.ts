import { toCandidate } from './candidate.js';
import type { DetectorParams } from './params.js';
import { selectCandidates, type GramStat } from './select.js';
import type { TermRecord } from './state.js';
import { aggregateTerms } from './terms.js';
import type { FlowCandidate } from '../../../../schemas/index.js';

function containsRun(hay: readonly string[], needle: readonly string[]): boolean {
  outer: for (let i = 0; i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return true;
  }
  return false;
}

/**
 * The window's records that count towards a sequence's support (the same rule as core/grams.ts: a sequence
 * longer than maxLength is counted only as a whole record).
 */
export function recordsContaining<R extends { tools: readonly string[] }>(
  tools: readonly string[],
  records: readonly R[],
  p: DetectorParams,
): R[] {
  return records.filter((r) =>
    tools.length > p.maxLength
      ? r.tools.length === tools.length && containsRun(r.tools, tools)
      : containsRun(r.tools, tools),
  );
}

/**
 * Frequent-sequence stats → the live candidates in the reference's shape (offline output = GET /candidates).
 * With request terms on, `records` (the window) gives each candidate the terms of its tasks' requests.
 */
export function liveCandidates(
  stats: Iterable<GramStat>,
  p: DetectorParams,
  records: readonly TermRecord[] = [],
): FlowCandidate[] {
  return selectCandidates(stats, p).map((s) =>
    toCandidate(
      s,
      p,
      p.requestTerms ? aggregateTerms(recordsContaining(s.tools, records, p).map((r) => r.terms)) : undefined,
    ),
  );
}
