import { describe, expect, it } from 'vitest';
import { admitWaiting, brokenPaths, type WaitCandidate } from '../../src/core/room.js';

const c = (spanId: string, parentSpanId: string | null, bytes = 100): WaitCandidate => ({
  spanId,
  parentSpanId,
  bytes,
});
const ids = (put: WaitCandidate[]) => put.map((p) => p.spanId);
const none = new Set<string>();
const admit = (
  candidates: WaitCandidate[],
  o: { stored?: Set<string>; pathLinks: Set<string>; room?: number; usedBytes?: number; maxBytes?: number },
) =>
  ids(
    admitWaiting({
      candidates,
      stored: o.stored ?? none,
      pathLinks: o.pathLinks,
      room: o.room ?? Infinity,
      usedBytes: o.usedBytes ?? 0,
      maxBytes: o.maxBytes ?? Infinity,
    }),
  );

describe('spans admitted to wait in a trace', () => {
  it('stores a tool span only with the links above it: one below a link that found no room is left out', () => {
    // root (unknown) ← l1 ← l2 ← t2, and t0 right below root; exported child first.
    const candidates = [c('t0', 'root'), c('t2', 'l2'), c('l2', 'l1'), c('l1', 'root')];
    const pathLinks = new Set(['l1', 'l2']);
    // Before: t0 and t2 took the room in the chunk's order, and t2 waited below links that were never stored.
    expect(admit(candidates, { pathLinks, room: 2 })).toEqual(['t0', 'l1']);
    expect(admit(candidates, { pathLinks, room: 4 })).toEqual(['t0', 'l1', 'l2', 't2']);
    // By bytes too: l2 does not fit, t2 below it is left out, a smaller span after it still fits.
    expect(
      admit([c('l1', 'root', 100), c('l2', 'l1', 500), c('t2', 'l2', 50), c('t3', 'l1', 50)], {
        pathLinks,
        maxBytes: 200,
      }),
    ).toEqual(['l1', 't3']);
  });

  it('counts a link already stored as reached, and one neither stored nor offered as not', () => {
    const pathLinks = new Set(['l1', 'l2']);
    expect(admit([c('t1', 'l1'), c('t2', 'l2')], { pathLinks, stored: new Set(['l1']) })).toEqual(['t1']);
  });

  it('leaves out a cycle', () => {
    const pathLinks = new Set(['a', 'b']);
    expect(admit([c('a', 'b'), c('b', 'a'), c('t', 'a'), c('u', 'x')], { pathLinks })).toEqual(['u']);
  });

  it('takes a chain of 5,000 links with 5,000 tool spans below it whole, or its top as far as the room goes', () => {
    const links = Array.from({ length: 5000 }, (_, i) => c(`l${i}`, i === 0 ? 'root' : `l${i - 1}`));
    const tools = Array.from({ length: 5000 }, (_, j) => c(`t${j}`, 'l4999'));
    // Exported child first: the tool spans, then the chain from its bottom.
    const candidates = [...tools, ...[...links].reverse()];
    const pathLinks = new Set(links.map((l) => l.spanId));
    expect(admit(candidates, { pathLinks, room: 10_000 })).toHaveLength(10_000);
    const part = admit(candidates, { pathLinks, room: 9_999 });
    expect(part).toHaveLength(9_999);
    expect(part.filter((id) => id.startsWith('l'))).toHaveLength(5000);
    const short = admit(candidates, { pathLinks, room: 4_999 });
    expect(short).toEqual(links.slice(0, 4999).map((l) => l.spanId));
  });
});

describe('paths of tool spans already waiting', () => {
  it('are broken by a link of the path neither stored nor admitted, and only by one', () => {
    // root (unknown) ← l1 ← l2 ← l3; l2 found no room.
    const parentOf = new Map<string, string | null>([
      ['l1', 'root'],
      ['l2', 'l1'],
      ['l3', 'l2'],
    ]);
    const pathLinks = new Set(['l1', 'l2', 'l3']);
    const broken = brokenPaths(pathLinks, new Set(['l1', 'l3']), parentOf);
    expect(broken('l3')).toBe(true);
    expect(broken('l1')).toBe(false);
    expect(broken('root')).toBe(false);
    expect(broken(null)).toBe(false);
    expect(brokenPaths(pathLinks, new Set(['l1', 'l2', 'l3']), parentOf)('l3')).toBe(false);
    // A cycle ends the walk (no agent span above: not waiting, whatever is answered).
    const cycle = new Map<string, string | null>([
      ['a', 'b'],
      ['b', 'a'],
    ]);
    expect(brokenPaths(new Set(['a', 'b']), new Set(['a', 'b']), cycle)('a')).toBe(false);
  });
});
