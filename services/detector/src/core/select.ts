import { DEDUPE_PREFIX, dedupeKeyOf } from '../../../../shared/core/dedupe-key.js';
import { COST_SCALE } from './ops.js';
import { SEP } from './grams.js';
import type { DetectorParams } from './params.js';

/** What the window knows about one sequence. */
export interface GramStat {
  key: string;
  /** Distinct records in the window that contain it. */
  support: number;
  /** Records in the window that consist of exactly it. */
  exact: number;
  /** Sum over occurrence records of the first occurrence's cost, in cost units. */
  cost: number;
}

export interface Selected {
  tools: string[];
  support: number;
  exact: number;
  cost: number;
  /** estimated_token_savings × 100, an integer (rounded half up), so ordering never meets float noise. */
  savingsHundredths: number;
  dedupeKey: string;
}

/**
 * The tool names a key was made of (shared/core's `dedupeKeyOf` read back), for what only has the key: a retraction, whose
 * title must name the tools as the active record's did. Every `%` in a key starts `%25` or `%E2%86%92`, so one
 * left-to-right pass reads each name one way. Nothing else reads a key back: `tool_sequence` carries the tools.
 */
export const toolsOfDedupeKey = (key: string): string[] =>
  (key.startsWith(DEDUPE_PREFIX) ? key.slice(DEDUPE_PREFIX.length) : key)
    .split('→')
    .map((n) => n.replace(/%25|%E2%86%92/g, (e) => (e === '%25' ? '%' : '→')));

/** avg × count × 0.95 = cost sum × 0.95, in hundredths of a cent, rounded half up, in integer arithmetic. */
export const savingsHundredths = (costUnits: number): number =>
  Math.floor((costUnits * 95 + COST_SCALE / 2) / COST_SCALE);

function isContiguousPart(inner: readonly string[], outer: readonly string[]): boolean {
  if (inner.length > outer.length) return false;
  outer: for (let i = 0; i + inner.length <= outer.length; i++) {
    for (let j = 0; j < inner.length; j++) if (outer[i + j] !== inner[j]) continue outer;
    return true;
  }
  return false;
}

export function compareSelected(a: Selected, b: Selected): number {
  return (
    b.savingsHundredths - a.savingsHundredths ||
    b.support - a.support ||
    b.tools.length - a.tools.length ||
    (a.dedupeKey < b.dedupeKey ? -1 : a.dedupeKey > b.dedupeKey ? 1 : 0)
  );
}

/**
 * The live candidates: frequent sequences (support ≥ minOccurrences) ordered by savings, occurrences, length,
 * dedupe_key; a sequence is kept unless it is a contiguous part of, or contains, one already kept.
 */
export function selectCandidates(stats: Iterable<GramStat>, p: DetectorParams): Selected[] {
  const frequent: Selected[] = [];
  for (const s of stats) {
    if (s.support < p.minOccurrences) continue;
    const tools = s.key.split(SEP);
    frequent.push({
      tools,
      support: s.support,
      exact: s.exact,
      cost: s.cost,
      savingsHundredths: savingsHundredths(s.cost),
      dedupeKey: dedupeKeyOf(tools),
    });
  }
  frequent.sort(compareSelected);
  const kept: Selected[] = [];
  for (const c of frequent) {
    if (kept.length >= p.maxCandidates) break;
    if (kept.some((k) => isContiguousPart(c.tools, k.tools) || isContiguousPart(k.tools, c.tools))) continue;
    kept.push(c);
  }
  return kept;
}
