import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { callScript, execPipeline } from '../../../../shared/redis/replies.js';
import { defineScripts, invokeScript } from '../../../../shared/redis/scripts.js';
import { RedisSessionStore, sessionKey, type SessionRef } from '../../src/adapters/redis/store.js';
import { StateCache } from '../../src/adapters/state-cache.js';
import { newSession, type SessionState } from '../../src/core/session.js';

let redis: Redis;
beforeAll(() => {
  redis = testRedis();
});
afterAll(() => redis.disconnect());

/** GET calls the server has answered: a cached read must not add one. */
async function gets(): Promise<number> {
  const m = /cmdstat_get:calls=(\d+)/.exec(await redis.info('commandstats'));
  return Number(m?.[1] ?? 0);
}

const stateWith = (step: string, index: number): SessionState => ({ ...newSession(), step, index });

/** One instance: its store, its cache on a clock the test moves. */
function instance(prefix: string, maxEntries = 100, maxAgeMs = 10_000) {
  const clock = { t: 1_000_000 };
  const store = new RedisSessionStore(
    redis,
    prefix,
    60_000,
    new StateCache(maxEntries, maxAgeMs, () => clock.t),
  );
  /** The batch path: read the CAS base from Redis, write the next state. */
  async function write(ref: SessionRef, state: SessionState) {
    const loaded = (await store.load(new Map([['k', ref]]))).get('k')!;
    await store.save([{ ref, state, version: loaded.version }]);
  }
  return { store, clock, write };
}

describe('allowed-tools state cache (real Redis)', () => {
  it('a state this instance wrote is read back with no Redis round trip, and never older than its last write', async () => {
    const a = instance(unique('cache'));
    const ref = { tenant: 't', agent: 'a', session: 's1' };
    await a.write(ref, stateWith('research', 1));
    const before = await gets();
    const r1 = await a.store.read(ref);
    expect(r1).toMatchObject({ cached: true, state: { step: 'research', index: 1 } });
    expect(await gets()).toBe(before);
    await a.write(ref, stateWith('research', 2));
    expect(await a.store.read(ref)).toMatchObject({ cached: true, state: { index: 2 } });
    // A session this instance never wrote comes from Redis.
    const miss = await gets();
    expect(await a.store.read({ ...ref, session: 'other' })).toMatchObject({ cached: false });
    expect(await gets()).toBe(miss + 1);
  });

  it("another instance's write: this one's cached state is served at most max-age, and its stale write fails and drops the entry", async () => {
    const prefix = unique('cache');
    const a = instance(prefix, 100, 5_000);
    const b = instance(prefix);
    const ref = { tenant: 't', agent: 'a', session: 's2' };
    await a.write(ref, stateWith('research', 1));
    const aVersion = (await a.store.load(new Map([['k', ref]]))).get('k')!.version;
    await b.write(ref, stateWith('evaluate', 1)); // a rebalance moved the session to b
    expect(await a.store.read(ref)).toMatchObject({ cached: true, state: { step: 'research' } });
    a.clock.t += 5_000;
    expect(await a.store.read(ref)).toMatchObject({ cached: false, state: { step: 'evaluate' } });

    // Back on a, before it re-read: the compare-and-set refuses the stale base and the entry goes.
    await a.write(ref, stateWith('research', 2));
    await expect(
      a.store.save([{ ref, state: stateWith('research', 3), version: aVersion }]),
    ).rejects.toMatchObject({ code: 'STATE_CONTENDED' });
    expect(await a.store.read(ref)).toMatchObject({ cached: false, state: { step: 'research', index: 2 } });
  });

  it('bounded: past its size the oldest write leaves first', async () => {
    const a = instance(unique('cache'), 2);
    const refs = ['x', 'y', 'z'].map((session) => ({ tenant: 't', agent: 'a', session }));
    for (const [i, ref] of refs.entries()) await a.write(ref, stateWith('s', i));
    expect(a.store.cache.size).toBe(2);
    expect((await a.store.read(refs[0]!)).cached).toBe(false);
    expect((await a.store.read(refs[1]!)).cached).toBe(true);
    expect((await a.store.read(refs[2]!)).cached).toBe(true);
  });

  it('a write whose outcome is unknown (connection lost) drops the entries it touched', async () => {
    const own = testRedis();
    const store = new RedisSessionStore(own, unique('cache'), 60_000, new StateCache(100, 60_000));
    const ref = { tenant: 't', agent: 'a', session: 's3' };
    const v = (await store.load(new Map([['k', ref]]))).get('k')!.version;
    await store.save([{ ref, state: stateWith('research', 1), version: v }]);
    expect(store.cache.size).toBe(1);
    own.disconnect();
    await expect(store.save([{ ref, state: stateWith('research', 2), version: '1' }])).rejects.toMatchObject({
      code: 'REDIS_UNAVAILABLE',
      retriable: true,
    });
    expect(store.cache.size).toBe(0);
  });
});

describe('stored values this version cannot read (real Redis)', () => {
  it('start their session afresh: loaded as new, read as new, and the next write lands', async () => {
    const prefix = unique('unreadable');
    const store = new RedisSessionStore(redis, prefix, 60_000);
    const values = {
      notJson: '3|\u0082\u00a1s\u00a4flow',
      // A session topic record whose state was damaged: the restore writes its value back as it is.
      truncated: '4|["s",2,0,[],[],[]',
      noVersion: '\u0082\u00a1s\u00a4flow',
      badVersion: 'v2|["s",2,0,[],[],[],0,"41"]',
      badOffset: `5|${JSON.stringify(['s', 2, 0, ['a'], [], ['e'], 0, 'x41'])}`,
    };
    for (const [session, value] of Object.entries(values)) {
      const ref = { tenant: 't', agent: 'a', session };
      await redis.set(sessionKey(prefix, ref), value);
      const loaded = (await store.load(new Map([['k', ref]]))).get('k')!;
      expect(loaded.state, session).toEqual(newSession());
      expect(await store.fromRedis(ref), session).toEqual(newSession());
      // The compare-and-set must accept the version loaded, or the batch would be retried for ever.
      await store.save([{ ref, state: stateWith('research', 1), version: loaded.version, key: loaded.key }]);
      expect((await store.load(new Map([['k', ref]]))).get('k')!.state, session).toMatchObject({
        step: 'research',
        index: 1,
      });
    }
  });
});

describe('one Redis reply path (real Redis)', () => {
  it('a script error is a bug (not retriable), in a pipeline and in a direct call', async () => {
    defineScripts(redis, [{ name: 'brokenForTest', numberOfKeys: 1, lua: 'return nosuchglobal.x' }]);
    const pipe = redis.pipeline();
    invokeScript(pipe, 'brokenForTest', [unique('k')], []);
    await expect(execPipeline(pipe, 'broken')).rejects.toMatchObject({
      code: 'REDIS_SCRIPT_FAILED',
      retriable: false,
    });
    await expect(callScript(redis, 'brokenForTest', [unique('k')], [])).rejects.toMatchObject({
      code: 'REDIS_SCRIPT_FAILED',
      retriable: false,
    });
  });

  it("an error reply to the store's read or compare-and-set script is a bug; a race is retriable", async () => {
    const prefix = unique('replies');
    const store = new RedisSessionStore(redis, prefix, 60_000);
    const ref = { tenant: 't', agent: 'a', session: 'wrong-type' };
    await redis.hset(sessionKey(prefix, ref), 'f', 'v'); // not a string: GET and the script both refuse it
    await expect(store.load(new Map([['k', ref]]))).rejects.toMatchObject({
      code: 'REDIS_SCRIPT_FAILED',
      retriable: false,
    });
    await expect(store.save([{ ref, state: newSession(), version: '' }])).rejects.toMatchObject({
      code: 'REDIS_SCRIPT_FAILED',
      retriable: false,
    });
    const raced = { ...ref, session: 'raced' };
    await store.save([{ ref: raced, state: newSession(), version: '' }]);
    await expect(store.save([{ ref: raced, state: newSession(), version: '' }])).rejects.toMatchObject({
      code: 'STATE_CONTENDED',
      retriable: true,
    });
  });
});
