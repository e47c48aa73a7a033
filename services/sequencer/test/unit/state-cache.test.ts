import { describe, expect, it } from 'vitest';
import { StateCache } from '../../src/adapters/state-cache.js';
import { newSession } from '../../src/core/session.js';

describe('state cache', () => {
  it('serves a write until it is max-age old; a newer write replaces it whatever the version', () => {
    let t = 0;
    const c = new StateCache(10, 100, () => t);
    c.written('k', { ...newSession(), index: 7 }, '7');
    t = 99;
    expect(c.get('k')?.state.index).toBe(7);
    c.written('k', { ...newSession(), index: 1 }, '1'); // the key was recreated in Redis: versions restart
    expect(c.get('k')).toMatchObject({ version: '1', state: { index: 1 } });
    t = 199;
    expect(c.get('k')).toBeUndefined();
    expect(c.size).toBe(0);
  });
  it('evicts the oldest write first; a rewrite makes a key the newest', () => {
    const c = new StateCache(2, 1000, () => 0);
    c.written('a', newSession(), '1');
    c.written('b', newSession(), '1');
    c.written('a', newSession(), '2');
    c.written('c', newSession(), '1');
    expect([c.get('a'), c.get('b'), c.get('c')].map(Boolean)).toEqual([true, false, true]);
  });
  it('size 0 or max age 0 holds nothing; drop removes', () => {
    for (const c of [new StateCache(0, 1000), new StateCache(10, 0)]) {
      c.written('a', newSession(), '1');
      expect(c.get('a')).toBeUndefined();
    }
    const c = new StateCache(10, 1000);
    c.written('a', newSession(), '1');
    c.drop('a');
    expect(c.get('a')).toBeUndefined();
  });
});
