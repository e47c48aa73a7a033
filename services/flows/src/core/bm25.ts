/**
 * Lower-cased word tokens (letters and digits of any script); snake_case and kebab-case split too. NFKC first,
 * as request terms are: "café" typed with a combining accent (NFD) would split into "cafe" and nothing, and
 * miss a flow described with the composed letter.
 */
export function tokenize(text: string): string[] {
  return (
    text
      .normalize('NFKC')
      .toLowerCase()
      .match(/[\p{L}\p{N}]+/gu) ?? []
  );
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

/** The slots of the documents that hold one term, packed for a fast walk; removal swaps in the last slot. */
class Posting {
  constructor(readonly term: string) {}
  slots = new Int32Array(4);
  size = 0;
  push(slot: number): number {
    if (this.size === this.slots.length) {
      const grown = new Int32Array(this.slots.length * 2);
      grown.set(this.slots);
      this.slots = grown;
    }
    this.slots[this.size] = slot;
    return this.size++;
  }
}

/**
 * Okapi BM25 (binary term frequency) with incremental add/remove (k1 1.2, b 0.75), postings per term over numeric
 * slots: a query touches only the documents that share a term with it and keeps the best `limit` in a small
 * heap, so 10,000 flows stay in the millisecond range. Hand-written: the npm BM25 packages rebuild the whole
 * index on every change, and the registry changes one flow at a time.
 *
 * Postings are packed slot arrays (a slot's place in each of its postings is kept, so removal is O(terms));
 * a query walks them into a reused score array and only a document that beats the heap's worst is
 * materialised. The order a posting lists its documents in does not change any answer: a document's score
 * sums its terms in query-term order, and the ranking is a total order (score, then id).
 */
export class Bm25Index {
  private readonly postings = new Map<string, Posting>();
  private readonly slotOf = new Map<string, number>();
  private ids: (string | null)[] = [];
  private lengths = new Float64Array(0);
  private docTerms: Posting[][] = [];
  /** Where the slot sits in each posting of `docTerms[slot]` (same order). */
  private docPlaces: number[][] = [];
  private readonly free: number[] = [];
  private totalLength = 0;
  private scores = new Float64Array(0);
  private touched = new Int32Array(0);
  /** Per slot, BM25's length-normalised denominator for `normAvg` (the same float the formula gives inline). */
  private norms = new Float64Array(0);
  private normAvg = Number.NaN;
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
    const distinct = new Set(ts);
    const slot = this.free.pop() ?? this.ids.length;
    this.ids[slot] = id;
    if (slot >= this.lengths.length) {
      const grown = new Float64Array(Math.max(16, (slot + 1) * 2));
      grown.set(this.lengths);
      this.lengths = grown;
    }
    this.lengths[slot] = ts.length;
    // The slot's norm at the cached average, as the search's recompute would give it: the norms are recomputed
    // only when the average moves, and a change can bring it back to the value cached (two documents whose
    // lengths swap), which left this slot scored by the length of the document it held before.
    if (slot < this.norms.length)
      this.norms[slot] = 1 + this.k1 * (1 - this.b + (this.b * ts.length) / this.normAvg);
    const mine: Posting[] = [];
    const places: number[] = [];
    for (const t of distinct) {
      let p = this.postings.get(t);
      if (!p) this.postings.set(t, (p = new Posting(t)));
      mine.push(p);
      places.push(p.push(slot));
    }
    this.docTerms[slot] = mine;
    this.docPlaces[slot] = places;
    this.slotOf.set(id, slot);
    this.totalLength += ts.length;
  }

  remove(id: string): void {
    const slot = this.slotOf.get(id);
    if (slot === undefined) return;
    const mine = this.docTerms[slot]!;
    const places = this.docPlaces[slot]!;
    for (let i = 0; i < mine.length; i++) {
      const p = mine[i]!;
      const at = places[i]!;
      const last = p.slots[--p.size]!;
      if (last !== slot) {
        // The last document of this posting moves into the freed place: update where it records it.
        p.slots[at] = last;
        this.docPlaces[last]![this.docTerms[last]!.indexOf(p)] = at;
      }
      if (p.size === 0) this.postings.delete(p.term);
    }
    this.totalLength -= this.lengths[slot]!;
    this.ids[slot] = null;
    this.docTerms[slot] = [];
    this.docPlaces[slot] = [];
    this.slotOf.delete(id);
    this.free.push(slot);
  }

  /** Documents with a positive score, best first; ties by id for a deterministic order. */
  search(query: string, limit: number): Scored[] {
    const n = this.slotOf.size;
    if (n === 0 || limit <= 0) return [];
    const avg = this.totalLength / n || 1;
    if (this.scores.length < this.ids.length) {
      this.scores = new Float64Array(this.ids.length * 2);
      this.touched = new Int32Array(this.ids.length * 2);
    }
    const { scores, touched, k1, b } = this;
    if (avg !== this.normAvg || this.norms.length < this.ids.length) {
      // Recomputed only when the average length moved (a flow added or removed), not per query.
      if (this.norms.length < this.ids.length) this.norms = new Float64Array(this.ids.length * 2);
      for (let slot = 0; slot < this.ids.length; slot++)
        this.norms[slot] = 1 + k1 * (1 - b + (b * this.lengths[slot]!) / avg);
      this.normAvg = avg;
    }
    const norms = this.norms;
    let nTouched = 0;
    for (const t of new Set(terms(query))) {
      const p = this.postings.get(t);
      if (!p || p.size === 0) continue;
      const df = p.size;
      const idf = Math.log(1 + (n - df + 0.5) / (df + 0.5));
      // Binary tf (1): idf·(k1 + 1) / (1 + k1·(1 − b + b·len/avg)).
      const num = idf * 1 * (k1 + 1);
      const slots = p.slots;
      for (let i = 0; i < df; i++) {
        const slot = slots[i]!;
        if (scores[slot] === 0) touched[nTouched++] = slot;
        scores[slot]! += num / norms[slot]!;
      }
    }
    // Keep the best `limit` in a min-heap (worst on top): O(touched · log limit), not a full sort. A document
    // whose score is below the worst kept one is dropped before anything is allocated for it.
    const heap: Scored[] = [];
    const worse = (x: Scored, y: Scored) => byScore(x, y) > 0;
    for (let j = 0; j < nTouched; j++) {
      const slot = touched[j]!;
      const score = scores[slot]!;
      scores[slot] = 0;
      if (heap.length === limit && score < heap[0]!.score) continue;
      const item = { id: this.ids[slot]!, score };
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
