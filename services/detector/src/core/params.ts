/** Detection parameters (the reference's table plus the streaming window). */
export interface DetectorParams {
  minLength: number;
  maxLength: number;
  minOccurrences: number;
  lookback: number;
  maxCandidates: number;
  /** Time window over completion time, in event-time ms; null = count window only. */
  windowMs: number | null;
  /** A task with no event for this long (event time) is complete. */
  taskIdleMs: number;
  /** How long (event time) a completed task id is remembered so late events for it are ignored. */
  doneRetentionMs: number;
  /** Events kept per open task; further events of that task are ignored (bounded memory). */
  maxTaskEvents: number;
  /**
   * Keep the terms of each task's first user message and attach their statistics to candidates. It shapes
   * only what candidates carry, not the window, so it is not part of the state fingerprint.
   */
  requestTerms: boolean;
}

export const DEFAULT_PARAMS: DetectorParams = {
  minLength: 3,
  maxLength: 12,
  minOccurrences: 3,
  lookback: 200,
  maxCandidates: 5,
  windowMs: null,
  taskIdleMs: 30 * 60_000,
  doneRetentionMs: 24 * 3_600_000,
  maxTaskEvents: 1_000,
  requestTerms: true,
};

/** The parameters that shape stored counts: state built with others cannot be reused. */
export function stateFingerprint(p: DetectorParams): string {
  return [
    p.minLength,
    p.maxLength,
    p.minOccurrences,
    p.lookback,
    p.windowMs ?? 0,
    p.taskIdleMs,
    p.doneRetentionMs,
    p.maxTaskEvents,
    // State layout version: v2 keeps open and completed tasks per partition (per-partition stream time);
    // v3 adds each task's start offset (what a rebuild after a Redis loss replays from) and the epoch;
    // v4 packs remembered task ids into strings, codes tool names, buckets the support counts (apply-11.lua).
    // v5 frees tool names no window record uses (tools:refs); v4 state is upgraded in place (apply-11.lua), and
    // its new stamp makes an instance of the previous version refuse it rather than misread it. Older layouts
    // are rebuilt from Kafka under a new epoch; a newer one stops this version (REDIS_STATE_CONFLICT).
    'v5',
  ].join('|');
}

export function validateParams(p: DetectorParams): string[] {
  const errs: string[] = [];
  if (p.minLength < 1) errs.push('min length must be ≥ 1');
  if (p.maxLength < p.minLength) errs.push('max length must be ≥ min length');
  if (p.minOccurrences < 1) errs.push('min occurrences must be ≥ 1');
  if (p.lookback < 1) errs.push('lookback must be ≥ 1');
  if (p.maxCandidates < 1) errs.push('max candidates must be ≥ 1');
  return errs;
}
