import type { DetectorParams } from './params.js';

/** Separator inside a gram key: a control character, which tool names may not contain. */
export const SEP = '\u001f';

export interface RecordGram {
  key: string;
  /** Cost of the gram's first occurrence in the record, in cost units. */
  cost: number;
}

/**
 * The distinct contiguous sequences a record contributes to support counts: every length from minLength to
 * maxLength, plus the whole record when it is at least minLength long (a whole record longer than maxLength
 * counts only as itself: "considered only when exact"). `whole` is the record's own key, for exact counts.
 */
export function recordGrams(
  tools: readonly string[],
  costs: readonly number[],
  p: DetectorParams,
): { grams: RecordGram[]; whole: string | null } {
  const n = tools.length;
  const prefix = new Array<number>(n + 1);
  prefix[0] = 0;
  for (let i = 0; i < n; i++) prefix[i + 1] = prefix[i]! + costs[i]!;
  const seen = new Map<string, number>();
  const top = Math.min(p.maxLength, n);
  for (let len = p.minLength; len <= top; len++) {
    for (let i = 0; i + len <= n; i++) {
      const key = tools.slice(i, i + len).join(SEP);
      if (!seen.has(key)) seen.set(key, prefix[i + len]! - prefix[i]!);
    }
  }
  let whole: string | null = null;
  if (n >= p.minLength) {
    whole = tools.join(SEP);
    if (!seen.has(whole)) seen.set(whole, prefix[n]!);
  }
  return { grams: [...seen].map(([key, cost]) => ({ key, cost })), whole };
}
