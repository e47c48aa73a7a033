/** A span of this chunk that would wait in its trace's hash: a tool span waiting for its agent span, or a link on its path. */
export interface WaitCandidate {
  spanId: string;
  parentSpanId: string | null;
  /** Bytes its record takes in the hash. */
  bytes: number;
}

/**
 * Which of a trace's candidates to store, within the room left: `room` spans and `maxBytes - usedBytes` bytes.
 * A span is stored only with its whole path up to the first unknown span: the links on it already stored
 * (`stored`), or stored now. A tool span stored below a link that found no room could never reach its agent span:
 * it was counted `pending`, then expired. It is not stored (the caller counts it `dropped`), and takes no room
 * from a span that can use it.
 *
 * Ancestors are offered before their descendants (by distance from the stored part of the path, then in the
 * chunk's order): an exporter writes a child before its parent, so in the chunk's order the tool spans took the
 * room and the links above them, which every one of them needs, found none. Each span's distance is found once
 * (a walk up its parents that stops at one already measured), so a request of a 5,000-link chain with 5,000 tool
 * spans below it takes 10,000 steps; listing each tool span's whole path took 25,000,000.
 *
 * `pathLinks`: every link on a waiting tool span's path, stored or a candidate; a parent outside it is the unknown
 * span the path waits for.
 */
export function admitWaiting(o: {
  candidates: readonly WaitCandidate[];
  stored: ReadonlySet<string>;
  pathLinks: ReadonlySet<string>;
  room: number;
  usedBytes: number;
  maxBytes: number;
}): WaitCandidate[] {
  const byId = new Map(o.candidates.map((c) => [c.spanId, c]));
  // Links between a candidate and the stored part of its path (or the unknown span); -1: cannot reach it (a cycle,
  // or a link on the path neither stored nor offered).
  const depth = new Map<string, number>();
  for (const c of o.candidates) {
    if (depth.has(c.spanId)) continue;
    const walk: string[] = [];
    const walked = new Set<string>();
    let at = c;
    // The depth of the last span walked, the one nearest the stored part.
    let top: number;
    for (;;) {
      if (walked.has(at.spanId)) {
        top = -1;
        break;
      }
      walk.push(at.spanId);
      walked.add(at.spanId);
      const parent = at.parentSpanId;
      if (parent === null || !o.pathLinks.has(parent) || o.stored.has(parent)) {
        top = 0;
        break;
      }
      const known = depth.get(parent);
      if (known !== undefined) {
        top = known < 0 ? -1 : known + 1;
        break;
      }
      const up = byId.get(parent);
      if (!up) {
        top = -1;
        break;
      }
      at = up;
    }
    for (let i = walk.length - 1; i >= 0; i--) {
      depth.set(walk[i]!, top);
      if (top >= 0) top++;
    }
  }
  const order = o.candidates
    .map((c, i) => ({ c, i, d: depth.get(c.spanId)! }))
    .filter((x) => x.d >= 0)
    .sort((a, b) => a.d - b.d || a.i - b.i);
  const put: WaitCandidate[] = [];
  const admitted = new Set<string>();
  let room = o.room;
  let bytes = o.usedBytes;
  for (const { c } of order) {
    if (room === 0) break;
    const parent = c.parentSpanId;
    if (parent !== null && o.pathLinks.has(parent) && !o.stored.has(parent) && !admitted.has(parent))
      continue;
    // A span that does not fit is left out as one past the count is; a smaller one after it may still fit.
    if (bytes + c.bytes > o.maxBytes) continue;
    put.push(c);
    admitted.add(c.spanId);
    bytes += c.bytes;
    room--;
  }
  return put;
}

/**
 * For a tool span already waiting: whether its path, from `start` (its parent) up through `pathLinks`, holds a
 * link not in `through` (stored, or admitted now). Such a link found no room when it was read, and a span is
 * exported once, so the tool span can never reach its agent span. Each link's answer is kept once found: linear
 * in the links over every tool span of the trace.
 */
export function brokenPaths(
  pathLinks: ReadonlySet<string>,
  through: ReadonlySet<string>,
  parentOf: ReadonlyMap<string, string | null>,
): (start: string | null) => boolean {
  const memo = new Map<string, boolean>();
  return (start) => {
    const walk: string[] = [];
    const walked = new Set<string>();
    let broken = false;
    for (let id = start; id !== null && pathLinks.has(id) && !walked.has(id);) {
      const known = memo.get(id);
      if (known !== undefined) {
        broken = known;
        break;
      }
      walk.push(id);
      walked.add(id);
      if (!through.has(id)) {
        broken = true;
        break;
      }
      id = parentOf.get(id) ?? null;
    }
    for (const w of walk) memo.set(w, broken);
    return broken;
  };
}
