/** Lower-cased word tokens (letters and digits of any script); snake_case and kebab-case split too. */
export function tokenize(text: string): string[] {
  return text.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
}

const STOP = new Set([
  'a',
  'an',
  'and',
  'the',
  'of',
  'to',
  'for',
  'in',
  'on',
  'with',
  'my',
  'me',
  'i',
  'is',
  'it',
  'this',
  'that',
  'be',
  'or',
  'by',
  'at',
  'as',
  'from',
]);
export const terms = (text: string) => tokenize(text).filter((t) => !STOP.has(t));

export interface Scored {
  id: string;
  score: number;
}

/**
 * Okapi BM25 (binary term frequency) with incremental add/remove (k1 1.2, b 0.75), postings per term over numeric slots: a query
 * touches only the documents that share a term with it and keeps the best `limit` in a small heap, so
 * 10,000 flows stay in the millisecond range. Hand-written: the npm BM25 packages rebuild the whole index on
 * every change, and the registry changes one flow at a time.
 */
export class Bm25Index {
  private readonly postings = new Map<string, Map<number, number>>();
  private readonly slotOf = new Map<string, number>();
  private ids: (string | null)[] = [];
  private lengths: number[] = [];
  private docTerms: string[][] = [];
  private readonly free: number[] = [];
  private totalLength = 0;
  private scores = new Float64Array(0);
  constructor(
    private readonly k1 = 1.2,
    private readonly b = 0.75,
  ) {}

  get size(): number {
    return this.slotOf.size;
  }

  add(id: string, text: string): void {
    this.remove(id);
    const ts = terms(text);
    // Each term counts once per flow: a tool named three times in a looping flow must not outrank a flow
    // that names it once (length normalisation still applies).
    const tf = new Map<string, number>();
    for (const t of ts) tf.set(t, 1);
    const slot = this.free.pop() ?? this.ids.length;
    this.ids[slot] = id;
    this.lengths[slot] = ts.length;
    this.docTerms[slot] = [...tf.keys()];
    this.slotOf.set(id, slot);
    for (const [t, n] of tf) {
      let p = this.postings.get(t);
      if (!p) this.postings.set(t, (p = new Map()));
      p.set(slot, n);
    }
    this.totalLength += ts.length;
  }

  remove(id: string): void {
    const slot = this.slotOf.get(id);
    if (slot === undefined) return;
    for (const t of this.docTerms[slot]!) {
      const p = this.postings.get(t)!;
      p.delete(slot);
      if (p.size === 0) this.postings.delete(t);
    }
    this.totalLength -= this.lengths[slot]!;
    this.ids[slot] = null;
    this.docTerms[slot] = [];
    this.slotOf.delete(id);
    this.free.push(slot);
  }

  /** Documents with a positive score, best first; ties by id for a deterministic order. */
  search(query: string, limit: number): Scored[] {
    const n = this.slotOf.size;
    if (n === 0 || limit <= 0) return [];
    const avg = this.totalLength / n || 1;
    if (this.scores.length < this.ids.length) this.scores = new Float64Array(this.ids.length * 2);
    const scores = this.scores;
    const touched: number[] = [];
    const { k1, b } = this;
    for (const t of new Set(terms(query))) {
      const p = this.postings.get(t);
      if (!p) continue;
      const idf = Math.log(1 + (n - p.size + 0.5) / (p.size + 0.5));
      for (const [slot, tf] of p) {
        if (scores[slot] === 0) touched.push(slot);
        scores[slot]! += (idf * tf * (k1 + 1)) / (tf + k1 * (1 - b + (b * this.lengths[slot]!) / avg));
      }
    }
    // Keep the best `limit` in a min-heap (worst on top): O(touched · log limit), not a full sort.
    const heap: Scored[] = [];
    const worse = (x: Scored, y: Scored) => byScore(x, y) > 0;
    for (const slot of touched) {
      const item = { id: this.ids[slot]!, score: scores[slot]! };
      scores[slot] = 0;
      if (heap.length < limit) {
        heap.push(item);
        for (let i = heap.length - 1; i > 0;) {
          const parent = (i - 1) >> 1;
          if (!worse(heap[i]!, heap[parent]!)) break;
          [heap[i], heap[parent]] = [heap[parent]!, heap[i]!];
          i = parent;
        }
      } else if (worse(heap[0]!, item)) {
        heap[0] = item;
        for (let i = 0; ;) {
          const l = 2 * i + 1;
          const r = l + 1;
          let w = i;
          if (l < heap.length && worse(heap[l]!, heap[w]!)) w = l;
          if (r < heap.length && worse(heap[r]!, heap[w]!)) w = r;
          if (w === i) break;
          [heap[i], heap[w]] = [heap[w]!, heap[i]!];
          i = w;
        }
      }
    }
    return heap.sort(byScore);
  }
}

export const byScore = (a: Scored, b: Scored) =>
  b.score - a.score || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

/** Reciprocal rank fusion: Σ w/(k + rank) over the rankings a document appears in (rank from 1; w = 1 unless weighted). */
export function rrf(
  rankings: readonly (readonly string[])[],
  k: number,
  weights: readonly number[] = [],
): Scored[] {
  const scores = new Map<string, number>();
  rankings.forEach((ranking, r) => {
    const w = weights[r] ?? 1;
    ranking.forEach((id, i) => scores.set(id, (scores.get(id) ?? 0) + w / (k + i + 1)));
  });
  return [...scores].map(([id, score]) => ({ id, score })).sort(byScore);
}

export function cosine(a: readonly number[], b: readonly number[]): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return na && nb ? dot / Math.sqrt(na * nb) : 0;
}
