/**
 * An independent batch implementation of the detector contract (issue "Detector", Semantics), written
 * straight from the text without the streaming code: given the completed records, it scans the window the
 * way the reference's batch job scans its last 200 records.
 */
export interface BatchRecord {
  task: string;
  ts: number;
  tools: string[];
  /** cost_cents per step; undefined = 1 */
  costs: (number | undefined)[];
  /** Terms of the task's first user message (core/terms.ts defines them); null/absent = no message. */
  terms?: string[] | null;
}
export interface BatchParams {
  minLength: number;
  maxLength: number;
  minOccurrences: number;
  lookback: number;
  maxCandidates: number;
  windowMs: number | null;
  /** Attach request terms (issue 14): df over the window's tasks containing the sequence. */
  requestTerms?: boolean;
}
export interface BatchCandidate {
  tool_sequence: string[];
  occurrence_count: number;
  match_type: 'exact' | 'subsequence';
  estimated_token_savings: number;
  avg_cost_per_execution: number;
  dedupe_key: string;
  request_terms?: { tasks: number; terms: { term: string; df: number }[] };
}

const units = (c: number | undefined) => (c === undefined ? 10_000 : Math.round(c * 10_000));

function indexOf(hay: string[], needle: string[]): number {
  for (let i = 0; i + needle.length <= hay.length; i++) {
    if (needle.every((t, j) => hay[i + j] === t)) return i;
  }
  return -1;
}

function cmpBytes(a: string, b: string): number {
  const x = Buffer.from(a, 'utf8');
  const y = Buffer.from(b, 'utf8');
  return Buffer.compare(x, y);
}

export function batchDetect(completed: BatchRecord[], maxTs: number, p: BatchParams): BatchCandidate[] {
  let window = [...completed].sort((a, b) => a.ts - b.ts || cmpBytes(a.task, b.task)).slice(-p.lookback);
  if (p.windowMs !== null) window = window.filter((r) => r.ts > maxTs - p.windowMs!);

  // Every sequence considered: contiguous runs of minLength..maxLength, and whole records ≥ minLength.
  const considered = new Map<string, string[]>();
  for (const r of window) {
    for (let len = p.minLength; len <= Math.min(p.maxLength, r.tools.length); len++) {
      for (let i = 0; i + len <= r.tools.length; i++) {
        const s = r.tools.slice(i, i + len);
        considered.set(JSON.stringify(s), s);
      }
    }
    if (r.tools.length >= p.minLength) considered.set(JSON.stringify(r.tools), r.tools);
  }

  const frequent: (BatchCandidate & { sumUnits: number; hundredths: number; occ: BatchRecord[] })[] = [];
  for (const s of considered.values()) {
    // Longer than maxLength: only whole-record (exact) occurrences count.
    const occ = window.filter((r) =>
      s.length > p.maxLength ? JSON.stringify(r.tools) === JSON.stringify(s) : indexOf(r.tools, s) >= 0,
    );
    if (occ.length < p.minOccurrences) continue;
    const exact = window.filter((r) => JSON.stringify(r.tools) === JSON.stringify(s)).length;
    let sumUnits = 0;
    for (const r of occ) {
      const at = indexOf(r.tools, s);
      for (let j = 0; j < s.length; j++) sumUnits += units(r.costs[at + j]);
    }
    const hundredths = Math.floor((sumUnits * 95 + 5_000) / 10_000);
    frequent.push({
      tool_sequence: s,
      occurrence_count: occ.length,
      match_type: exact >= p.minOccurrences ? 'exact' : 'subsequence',
      estimated_token_savings: hundredths / 100,
      avg_cost_per_execution: Math.round(sumUnits / occ.length) / 10_000,
      dedupe_key: 'flow_offload:' + s.map((t) => t.replace(/%/g, '%25').replace(/→/g, '%E2%86%92')).join('→'),
      sumUnits,
      hundredths,
      occ,
    });
  }
  frequent.sort(
    (a, b) =>
      b.hundredths - a.hundredths ||
      b.occurrence_count - a.occurrence_count ||
      b.tool_sequence.length - a.tool_sequence.length ||
      (a.dedupe_key < b.dedupe_key ? -1 : a.dedupe_key > b.dedupe_key ? 1 : 0),
  );
  const kept: typeof frequent = [];
  for (const c of frequent) {
    if (kept.length === p.maxCandidates) break;
    const nested = kept.some(
      (k) => indexOf(k.tool_sequence, c.tool_sequence) >= 0 || indexOf(c.tool_sequence, k.tool_sequence) >= 0,
    );
    if (!nested) kept.push(c);
  }
  return kept.map(({ sumUnits: _s, hundredths: _h, occ, ...c }) => {
    if (!p.requestTerms) return c;
    // Issue 14: per term, in how many of the containing tasks' first messages it appears; top 64 by
    // df desc, then term in byte order.
    const withMsg = occ.filter((r) => r.terms !== undefined && r.terms !== null);
    const df = new Map<string, number>();
    for (const r of withMsg) for (const t of new Set(r.terms)) df.set(t, (df.get(t) ?? 0) + 1);
    const terms = [...df.entries()]
      .map(([term, n]) => ({ term, df: n }))
      .sort((a, b) => b.df - a.df || cmpBytes(a.term, b.term))
      .slice(0, 64);
    return { ...c, request_terms: { tasks: withMsg.length, terms } };
  });
}
