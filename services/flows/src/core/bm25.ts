/** Lower-cased word tokens (letters and digits of any script); snake_case and kebab-case split too. */
export function tokenize(text: string): string[] {
  return text.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
}

const STOP = new Set(['a', 'an', 'and', 'the', 'of', 'to', 'for', 'in', 'on', 'with', 'my', 'me', 'i', 'is', 'it', 'this', 'that', 'be', 'or', 'by', 'at', 'as', 'from']);
export const terms = (text: string) => tokenize(text).filter((t) => !STOP.has(t));

export interface Scored {
  id: string;
  score: number;
}

/**
 * Okapi BM25 with incremental add/remove (k1 1.2, b 0.75), postings per term: a query touches only the
 * documents that share a term with it, so 10,000 flows stay in the millisecond range. Hand-written: the
 * npm BM25 packages rebuild the whole index on every change, and the registry changes one flow at a time.
 */
export class Bm25Index {
  private readonly postings = new Map<string, Map<string, number>>();
  private readonly lengths = new Map<string, number>();
  private readonly docTerms = new Map<string, string[]>();
  private totalLength = 0;
  constructor(
    private readonly k1 = 1.2,
    private readonly b = 0.75,
  ) {}

  get size(): number {
    return this.lengths.size;
  }

  add(id: string, text: string): void {
    this.remove(id);
    const ts = terms(text);
    const tf = new Map<string, number>();
    for (const t of ts) tf.set(t, (tf.get(t) ?? 0) + 1);
    for (const [t, n] of tf) {
      let p = this.postings.get(t);
      if (!p) this.postings.set(t, (p = new Map()));
      p.set(id, n);
    }
    this.lengths.set(id, ts.length);
    this.docTerms.set(id, [...tf.keys()]);
    this.totalLength += ts.length;
  }

  remove(id: string): void {
    const ts = this.docTerms.get(id);
    if (!ts) return;
    for (const t of ts) {
      const p = this.postings.get(t)!;
      p.delete(id);
      if (p.size === 0) this.postings.delete(t);
    }
    this.totalLength -= this.lengths.get(id)!;
    this.lengths.delete(id);
    this.docTerms.delete(id);
  }

  /** Documents with a positive score, best first; ties by id for a deterministic order. */
  search(query: string, limit: number): Scored[] {
    const n = this.lengths.size;
    if (n === 0) return [];
    const avg = this.totalLength / n || 1;
    const scores = new Map<string, number>();
    for (const t of new Set(terms(query))) {
      const p = this.postings.get(t);
      if (!p) continue;
      const idf = Math.log(1 + (n - p.size + 0.5) / (p.size + 0.5));
      for (const [id, tf] of p) {
        const len = this.lengths.get(id)!;
        const s = (idf * tf * (this.k1 + 1)) / (tf + this.k1 * (1 - this.b + (this.b * len) / avg));
        scores.set(id, (scores.get(id) ?? 0) + s);
      }
    }
    return [...scores].map(([id, score]) => ({ id, score })).sort(byScore).slice(0, limit);
  }
}

export const byScore = (a: Scored, b: Scored) => b.score - a.score || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

/** Reciprocal rank fusion: Σ 1/(k + rank) over the rankings a document appears in (rank from 1). */
export function rrf(rankings: readonly (readonly string[])[], k: number): Scored[] {
  const scores = new Map<string, number>();
  for (const ranking of rankings) ranking.forEach((id, i) => scores.set(id, (scores.get(id) ?? 0) + 1 / (k + i + 1)));
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
