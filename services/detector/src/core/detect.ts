import { toCandidate } from './candidate.js';
import type { DetectorParams } from './params.js';
import { selectCandidates, type GramStat } from './select.js';
import type { FlowCandidate } from '../../../../schemas/index.js';

/** Frequent-sequence stats → the live candidates in the reference's shape (offline output = GET /candidates). */
export function liveCandidates(stats: Iterable<GramStat>, p: DetectorParams): FlowCandidate[] {
  return selectCandidates(stats, p).map((s) => toCandidate(s, p));
}
