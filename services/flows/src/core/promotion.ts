import type { FlowCandidateRecord } from '../../../../schemas/index.js';
import { wilsonLower } from '../../../../shared/core/wilson.js';
import type { Match } from './score.js';

export interface PromotionPolicy {
  mode: 'manual' | 'auto';
  minOccurrences: number;
  minSavings: number;
  /**
   * Under `auto`, shadow requests a candidate must have been chosen for before it is promoted (0 = promote on
   * the thresholds alone).
   */
  shadowTrials: number;
  /** Under `auto`, the Wilson lower bound (95%) of its shadow step precision must reach this. */
  shadowPrecision: number;
}

export type CandidateStatus = 'pending' | 'promoted' | 'rejected' | 'retracted';

export interface StoredCandidate {
  record: FlowCandidateRecord;
  status: CandidateStatus;
  /** A promoted candidate the detector later retracted stays promoted, and says so. */
  retracted: boolean;
  decided_at: number | null;
  /** Requests it was chosen for in shadow (selection over pending candidates, nothing shown to the agent). */
  shadow_trials: number;
  /** Steps it proposed in those requests, and how many equalled what the agent did (see score.ts). */
  shadow_proposed: number;
  shadow_matched: number;
}

/** What happens to a candidate; the service and the replay carry it out, nothing else decides. */
export type Decision =
  | { kind: 'ignore'; reason: 'stale' | 'unknown_retraction' | 'not_pending' }
  | { kind: 'store'; next: StoredCandidate }
  | { kind: 'promote'; next: StoredCandidate };

export const shadowPrecision = (c: Pick<StoredCandidate, 'shadow_proposed' | 'shadow_matched'>) =>
  c.shadow_proposed ? c.shadow_matched / c.shadow_proposed : null;

const autoReady = (c: StoredCandidate, p: PromotionPolicy) =>
  p.mode === 'auto' &&
  c.record.occurrence_count >= p.minOccurrences &&
  c.record.estimated_token_savings >= p.minSavings &&
  (p.shadowTrials === 0 ||
    (c.shadow_trials >= p.shadowTrials &&
      wilsonLower(c.shadow_matched, c.shadow_proposed) >= p.shadowPrecision));

const fresh = (r: FlowCandidateRecord): StoredCandidate => ({
  record: r,
  status: 'pending',
  retracted: false,
  decided_at: null,
  shadow_trials: 0,
  shadow_proposed: 0,
  shadow_matched: 0,
});

/** Is this candidate in the shadow pool (chosen among in shadow, its outcomes counted)? */
export const inShadow = (c: StoredCandidate, p: PromotionPolicy) =>
  p.mode === 'auto' &&
  p.shadowTrials > 0 &&
  c.status === 'pending' &&
  !c.retracted &&
  !!(c.record.candidate ?? c.record.promotion_effect);

/**
 * The next state of a candidate when the detector publishes `r`. Older records (redelivery, replays) never
 * overwrite newer ones; a rejected key stays rejected whatever arrives; `auto` promotes above both thresholds
 * and, when shadow trials are required, only once the shadow record is good enough. A new version of a
 * pending candidate keeps its shadow record: the steps are the dedupe key, so they did not change.
 */
export function onCandidate(
  prev: StoredCandidate | undefined,
  r: FlowCandidateRecord,
  p: PromotionPolicy,
  now: number,
): Decision {
  if (prev && prev.record.detected_at > r.detected_at) return { kind: 'ignore', reason: 'stale' };
  if (prev?.status === 'rejected')
    return { kind: 'store', next: { ...prev, record: r, retracted: r.status === 'retracted' } };
  if (r.status === 'retracted') {
    if (!prev) return { kind: 'ignore', reason: 'unknown_retraction' };
    return {
      kind: 'store',
      next: {
        ...prev,
        // What it proposed is kept (the retraction carries none), stamped with the retraction's time: a copy of
        // the record it came after, read again with its batch (a restart, a rebalance), is then stale. With the
        // older stamp, that copy made the candidate pending again, and under `auto` promoted the retracted flow.
        record: {
          ...prev.record,
          status: 'retracted',
          detected_at: Math.max(prev.record.detected_at, r.detected_at),
        },
        status: prev.status === 'promoted' ? 'promoted' : 'retracted',
        retracted: true,
      },
    };
  }
  if (prev?.status === 'promoted') return { kind: 'store', next: { ...prev, record: r, retracted: false } };
  const next: StoredCandidate = prev
    ? { ...prev, record: r, status: 'pending', retracted: false, decided_at: null }
    : fresh(r);
  return autoReady(next, p)
    ? { kind: 'promote', next: { ...next, status: 'promoted', decided_at: now } }
    : { kind: 'store', next };
}

/**
 * A promotion refused because its flow would break the flows.v1 contract: the candidate as it would have been
 * stored without it (pending). Only automatic promotions come here, and they promote pending candidates only.
 */
export const refusePromotion = (d: Decision & { kind: 'promote' }): Decision => ({
  kind: 'store',
  next: { ...d.next, status: 'pending', decided_at: null },
});

/** A shadow choice's outcome: counted on a pending candidate, which `auto` may then promote. */
export function onShadowOutcome(prev: StoredCandidate, m: Match, p: PromotionPolicy, now: number): Decision {
  if (prev.status !== 'pending' || prev.retracted) return { kind: 'ignore', reason: 'not_pending' };
  const next: StoredCandidate = {
    ...prev,
    shadow_trials: prev.shadow_trials + 1,
    shadow_proposed: prev.shadow_proposed + m.proposed,
    shadow_matched: prev.shadow_matched + m.matched,
  };
  return autoReady(next, p)
    ? { kind: 'promote', next: { ...next, status: 'promoted', decided_at: now } }
    : { kind: 'store', next };
}

export type ManualDecision =
  | { kind: 'not_found' }
  | { kind: 'conflict'; error: string }
  /** Its flow would break the flows.v1 contract (why, in `error`): nothing is written. */
  | { kind: 'unpromotable'; error: string }
  | { kind: 'rejected'; next: StoredCandidate }
  | { kind: 'promoted'; next: StoredCandidate };

/** An operator's promote or reject (manual promotion stays possible under every policy). */
export function decide(
  c: StoredCandidate | undefined,
  to: 'promote' | 'reject',
  now: number,
): ManualDecision {
  if (!c) return { kind: 'not_found' };
  if (to === 'reject') {
    if (c.status === 'promoted') return { kind: 'conflict', error: 'already promoted' };
    return { kind: 'rejected', next: { ...c, status: 'rejected', decided_at: now } };
  }
  if (c.status === 'rejected') return { kind: 'conflict', error: 'rejected candidates are not promoted' };
  if (c.retracted && c.status !== 'promoted')
    return { kind: 'conflict', error: 'the detector retracted this candidate' };
  if (!c.record.candidate && !c.record.promotion_effect)
    return { kind: 'conflict', error: 'the candidate carries no proposed flow' };
  return { kind: 'promoted', next: { ...c, status: 'promoted', decided_at: now } };
}
