import { describe, expect, it, vi } from 'vitest';
import { answerFromState, type StateReader } from '../../src/adapters/answer.js';
import { StateCache } from '../../src/adapters/state-cache.js';
import { newSession, type SessionState } from '../../src/core/session.js';

const ref = { tenant: 't', agent: 'a', session: 's' };
const cachedState: SessionState = { ...newSession(), step: 'cached', index: 2 };
const redisState: SessionState = { ...newSession(), step: 'redis' };

/** A check that resolves when told to, and a store over one cache entry. */
function setup() {
  const cache = new StateCache(10, 60_000);
  cache.written('k', cachedState, '3');
  let release: () => void = () => undefined;
  let fail: (e: Error) => void = () => undefined;
  const checks: Promise<void>[] = [];
  const ensure = () => {
    const p = new Promise<void>((res, rej) => {
      release = res;
      fail = rej;
    });
    checks.push(p);
    return p;
  };
  const redisReads: number[] = [];
  // What Redis holds: the state, or nothing until a restore writes it back.
  let inRedis: SessionState | null = redisState;
  const store: StateReader = {
    cached: () => cache.get('k')?.state,
    fromRedis: () => (redisReads.push(checks.length), Promise.resolve(inRedis)),
  };
  const sources: string[] = [];
  let rebuilding = false;
  const answer = answerFromState({
    ensure,
    rebuilding: () => rebuilding,
    cache,
    store,
    onRead: (s) => sources.push(s),
  });
  return {
    setRedis: (s: SessionState | null) => (inRedis = s),
    checks,
    setRebuilding: (b: boolean) => (rebuilding = b),
    cache,
    answer,
    sources,
    redisReads,
    release: () => release(),
    fail: (e: Error) => fail(e),
  };
}

describe('allowed-tools answer from state', () => {
  it('answers from the cached state, computed before the epoch check replied, once it found no loss', async () => {
    const t = setup();
    const seen: (string | null)[] = [];
    const out = t.answer(ref, (s) => (seen.push(s.step), s.step));
    expect(seen).toEqual(['cached']); // computed while the check is in flight
    let done = false;
    void out.then(() => (done = true));
    await Promise.resolve();
    expect(done).toBe(false); // nothing is sent before the check replied
    t.release();
    expect(await out).toBe('cached');
    expect(t.sources).toEqual(['cache']);
  });

  it('a loss found by the check (the cache cleared) discards the early answer: the state is read again', async () => {
    const t = setup();
    const out = t.answer(ref, (s) => s.step);
    t.cache.clear(); // what the guard's rebuild does when the marker says the states are gone
    t.release();
    expect(await out).toBe('redis');
    expect(t.sources).toEqual(['redis']);
  });

  it('a failed check fails the read, with no answer sent and no unhandled rejection', async () => {
    const t = setup();
    const out = t.answer(ref, (s) => s.step);
    t.fail(new Error('redis down'));
    await expect(out).rejects.toThrow('redis down');
    expect(t.sources).toEqual([]);
  });

  it('a session not cached is read from Redis alongside the check, and answers once the check found no loss', async () => {
    const t = setup();
    t.cache.drop('k');
    const out = t.answer(ref, (s) => s.step);
    expect(t.redisReads).toHaveLength(1); // sent before the check replied: one round trip, not two
    t.release();
    expect(await out).toBe('redis');
    expect(t.sources).toEqual(['redis']);
  });

  it('a session not cached and a failed check: the read fails, whatever its own GET did', async () => {
    const t = setup();
    t.cache.drop('k');
    const out = t.answer(ref, (s) => s.step);
    t.fail(new Error('redis down'));
    await expect(out).rejects.toThrow('redis down');
  });

  it('a session not cached whose GET met a loss: read again once the restore is done, not answered as new', async () => {
    const t = setup();
    t.cache.drop('k');
    t.setRedis(newSession()); // the loss: the GET sent with the check finds nothing
    const out = t.answer(ref, (s) => s.step);
    expect(t.redisReads).toHaveLength(1);
    t.cache.clear(); // the check found the loss; the restore writes the state back before the check returns
    t.setRedis(redisState);
    t.release();
    expect(await out).toBe('redis');
    expect(t.redisReads).toHaveLength(2);
  });

  it('a read that arrives while a restore runs sends no GET of its own before the restore is done', async () => {
    const t = setup();
    t.cache.drop('k');
    t.setRebuilding(true);
    t.setRedis(newSession());
    const out = t.answer(ref, (s) => s.step);
    expect(t.redisReads).toHaveLength(0);
    t.setRedis(redisState);
    t.setRebuilding(false);
    t.release();
    expect(await out).toBe('redis');
  });

  it('a read that met a loss its check had not seen (the marker gone on the connection of the read) checks again, then reads again', async () => {
    const t = setup();
    t.cache.drop('k');
    t.setRedis(null); // the store saw the marker gone right after the session's GET
    const out = t.answer(ref, (s) => s.step);
    t.release(); // the first check (its own connection) had seen nothing
    await vi.waitFor(() => expect(t.checks).toHaveLength(2)); // checked again: the restore runs there
    t.setRedis(redisState);
    t.release();
    expect(await out).toBe('redis');
    expect(t.redisReads).toHaveLength(2);
  });
});
