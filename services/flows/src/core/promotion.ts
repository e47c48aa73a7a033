import type { FlowCandidateRecord } from '../../../../schemas/index.js';

export interface PromotionPolicy {
  mode: 'manual' | 'auto';
  minOccurrences: number;
  minSavings: number;
}

export type CandidateStatus = 'pending' | 'promoted' | 'rejected' | 'retracted';

export interface StoredCandidate {
  record: FlowCandidateRecord;
  status: CandidateStatus;
  /** A promoted candidate the detector later retracted stays promoted, and says so. */
  retracted: boolean;
  decided_at: number | null;
}

/**
 * The next state of a candidate when the detector publishes `r`. Older records (redelivery, replays) never
 * overwrite newer ones; a rejected key stays rejected whatever arrives; `auto` promotes above both thresholds.
 */
export function onCandidate(
  prev: StoredCandidate | undefined,
  r: FlowCandidateRecord,
  p: PromotionPolicy,
  now: number,
): { next: StoredCandidate; promote: boolean } | null {
  if (prev && prev.record.detected_at > r.detected_at) return null;
  if (prev?.status === 'rejected')
    return { next: { ...prev, record: r, retracted: r.status === 'retracted' }, promote: false };
  if (r.status === 'retracted') {
    if (!prev) return null;
    return {
      next: {
        ...prev,
        record: { ...prev.record, status: 'retracted' },
        status: prev.status === 'promoted' ? 'promoted' : 'retracted',
        retracted: true,
      },
      promote: false,
    };
  }
  if (prev?.status === 'promoted') return { next: { ...prev, record: r, retracted: false }, promote: false };
  const auto =
    p.mode === 'auto' && r.occurrence_count >= p.minOccurrences && r.estimated_token_savings >= p.minSavings;
  return {
    next: {
      record: r,
      status: auto ? 'promoted' : 'pending',
      retracted: false,
      decided_at: auto ? now : null,
    },
    promote: auto,
  };
}
