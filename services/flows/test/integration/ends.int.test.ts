import { afterAll, describe, expect, it } from 'vitest';
import type { EngineDeps } from '../../src/adapters/engine.js';
import type { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { A, T, closeFixture, engine, place, record, redis, session } from './engine-fixture.js';

/*
 * A session's end has two durable effects: its run joins the outcome memory, and its shadow choice is scored on
 * the candidate. A batch that fails after either (Redis refusing a write, the broker gone) is applied again, by
 * the runner's retry or, after a restart, by the partition's next reader. Before each effect recorded how far
 * the end went, every such delivery recorded the run again, and a restart scored the shadow trial again.
 */

afterAll(closeFixture);

const CAPACITY = 50;
const DAY_MS = 86_400_000;

/** The service's wiring of sessions and runs to Redis (main.ts); the session save fails while `fail.on`. */
function durable(store: RedisFlowStore, fail = { on: false }): Partial<EngineDeps> {
  return {
    sessions: {
      load: (refs) => store.loadSessions(refs),
      save: async (open, ended) => {
        if (fail.on) throw new Error('injected: session save failed');
        await store.saveSessions(open, ended, DAY_MS);
      },
    },
    runs: {
      load: (t, a) => store.loadRuns(t, a),
      append: (t, a, run, mark) => store.appendRun(t, a, run, CAPACITY, mark, DAY_MS),
    },
  };
}

// Shadow trials on, a bar never reached: every finished session's shadow choice is one more trial.
const SHADOW = { minOccurrences: 1, shadowTrials: 1000, shadowPrecision: 0 };

describe('flows: a session end delivered again is counted once (real Redis and Kafka)', () => {
  it('a batch failing after the run was recorded, retried and read again after a restart: one run, one trial', async () => {
    const { prefix, flowsTopic, policy, store } = await place(SHADOW);
    const started = () => engine(store, policy, flowsTopic, Date.now, durable(store));
    const first = started();
    await first.e.handle([{ kind: 'candidate', r: record('k1', 5, 1) }]);
    expect(first.e.shadow.list(T, A)).toHaveLength(1);
    const outcomes = `${prefix}:flows:{${T}|${A}}:outcomes`;

    // Redis refuses the candidates' read: the shadow outcome cannot be written, so the batch fails after the
    // session's run was recorded. The runner's retry, then the partition's next reader after a restart.
    const batch = session('s1', { partition: 0, offset: 10 });
    const restarted = started();
    await candidatesRefused(prefix, async () => {
      await expect(first.e.handle(batch)).rejects.toThrow(/WRONGTYPE/);
      await expect(first.e.handle(batch)).rejects.toThrow(/WRONGTYPE/);
      await expect(restarted.e.handle(batch)).rejects.toThrow(/WRONGTYPE/);
    });
    await restarted.e.handle(batch);

    const check = async () => {
      expect(await redis.lrange(outcomes, 0, -1)).toHaveLength(1);
      const c = (await store.getCandidates(T, A, ['k1'])).get('k1');
      expect(c).toMatchObject({ status: 'pending', shadow_trials: 1, shadow_proposed: 2, shadow_matched: 2 });
      const left = await redis.get(`${prefix}:flows:{${T}|${A}}:session:s1`);
      expect(JSON.parse(left!)).toEqual({ ended: true, at: '0:13', requests: ['s1:u'] });
    };
    await check();
    // Delivered once more after it went through (offsets not committed when a process died): nothing changes.
    await started().e.handle(batch);
    await check();
  });

  it('a batch failing after the shadow outcome was written, then read again after a restart: one run, one trial', async () => {
    const { prefix, flowsTopic, policy, store } = await place(SHADOW);
    const fail = { on: true };
    const started = () => engine(store, policy, flowsTopic, Date.now, durable(store, fail));
    const first = started();
    await first.e.handle([{ kind: 'candidate', r: record('k2', 5, 1) }]);
    const batch = session('s2', { partition: 1, offset: 7 });
    // Both effects land; the session save at the batch's end fails, so its offsets are never committed.
    await expect(first.e.handle(batch)).rejects.toThrow(/injected/);
    // A restart (its shadow pool restored from the candidates, as the service does): the batch is read again.
    fail.on = false;
    const restarted = started();
    restarted.e.restoreShadow(T, A, await store.listCandidates(T, A));
    const out = await restarted.e.handle(batch);
    // The request still gets its selection (that output may not have gone out).
    expect(out.map((r) => r.event_id)).toEqual(['s2:u']);

    expect(await redis.lrange(`${prefix}:flows:{${T}|${A}}:outcomes`, 0, -1)).toHaveLength(1);
    const c = (await store.getCandidates(T, A, ['k2'])).get('k2');
    expect(c).toMatchObject({ shadow_trials: 1 });
  });

  it("an instance expelled by a stall, delivering an end the partition's next owner applied: no second run or trial", async () => {
    const { prefix, flowsTopic, policy, store } = await place(SHADOW);
    const started = () => engine(store, policy, flowsTopic, Date.now, durable(store));
    const stalled = started();
    await stalled.e.handle([{ kind: 'candidate', r: record('k3', 5, 1) }]);
    const whole = session('s3', { partition: 2, offset: 40 });
    // The stalled instance applied the session up to its end; it still holds it when it wakes up.
    await stalled.e.handle(whole.slice(0, -1));
    // Meanwhile the partition's next owner read from the last commit: the whole session, its end included.
    const owner = started();
    owner.e.restoreShadow(T, A, await store.listCandidates(T, A));
    await owner.e.handle(whole);
    await stalled.e.handle(whole.slice(-1));

    expect(await redis.lrange(`${prefix}:flows:{${T}|${A}}:outcomes`, 0, -1)).toHaveLength(1);
    expect((await store.getCandidates(T, A, ['k3'])).get('k3')).toMatchObject({ shadow_trials: 1 });
  });

  /** Redis refuses the candidates' read while `during` runs (the key holds a string meanwhile). */
  async function candidatesRefused(prefix: string, during: () => Promise<void>) {
    const candidates = `${prefix}:flows:{${T}|${A}}:candidates`;
    await redis.rename(candidates, `${candidates}:aside`);
    await redis.set(candidates, 'not a hash');
    try {
      await during();
    } finally {
      await redis.del(candidates);
      await redis.rename(`${candidates}:aside`, candidates);
    }
  }

  it('the stalled instance records the run and fails to score; the next owner scores the trial', async () => {
    const { prefix, flowsTopic, policy, store } = await place(SHADOW);
    const started = () => engine(store, policy, flowsTopic, Date.now, durable(store));
    const stalled = started();
    await stalled.e.handle([{ kind: 'candidate', r: record('k4', 5, 1) }]);
    const whole = session('s4', { partition: 3, offset: 60 });
    await stalled.e.handle(whole.slice(0, -1));
    // The next owner read from the last commit: it holds the session too, up to its end.
    const owner = started();
    owner.e.restoreShadow(T, A, await store.listCandidates(T, A));
    await owner.e.handle(whole.slice(0, -1));
    // The stalled instance delivers the end: its run is recorded, its shadow outcome cannot be written.
    await candidatesRefused(prefix, () =>
      expect(stalled.e.handle(whole.slice(-1))).rejects.toThrow(/WRONGTYPE/),
    );
    // The owner delivers it (the run found recorded, it writes the trial), then the stalled one retries.
    await owner.e.handle(whole.slice(-1));
    await stalled.e.handle(whole.slice(-1));

    expect(await redis.lrange(`${prefix}:flows:{${T}|${A}}:outcomes`, 0, -1)).toHaveLength(1);
    expect((await store.getCandidates(T, A, ['k4'])).get('k4')).toMatchObject({ shadow_trials: 1 });
  });

  it("a save at the run's position keeps the mark that the run was recorded", async () => {
    const { prefix, flowsTopic, policy, store } = await place(SHADOW);
    const stalled = engine(store, policy, flowsTopic, Date.now, durable(store));
    await stalled.e.handle([{ kind: 'candidate', r: record('k5', 5, 1) }]);
    const whole = session('s5', { partition: 4, offset: 80 });
    await stalled.e.handle(whole.slice(0, -1));
    const fail = { on: true };
    const owner = engine(store, policy, flowsTopic, Date.now, durable(store, fail));
    owner.e.restoreShadow(T, A, await store.listCandidates(T, A));
    // The owner holds the session up to its end; its save is still to come (it failed once).
    await expect(owner.e.handle(whole.slice(0, -1))).rejects.toThrow(/injected/);
    // The stalled instance records the run (the mark, at the owner's position) and fails to score.
    await candidatesRefused(prefix, () =>
      expect(stalled.e.handle(whole.slice(-1))).rejects.toThrow(/WRONGTYPE/),
    );
    fail.on = false;
    // The owner's retry saves its state at the same position, then delivers the end.
    await owner.e.handle(whole.slice(0, -1));
    await owner.e.handle(whole.slice(-1));

    expect(await redis.lrange(`${prefix}:flows:{${T}|${A}}:outcomes`, 0, -1)).toHaveLength(1);
    expect((await store.getCandidates(T, A, ['k5'])).get('k5')).toMatchObject({ shadow_trials: 1 });
  });

  it('two deliveries racing to score one end: one trial lands, the other writes nothing', async () => {
    const { prefix, flowsTopic, policy, store } = await place(SHADOW);
    const started = () => engine(store, policy, flowsTopic, Date.now, durable(store));
    const a = started();
    await a.e.handle([{ kind: 'candidate', r: record('k6', 5, 1) }]);
    const whole = session('s6', { partition: 5, offset: 5 });
    await a.e.handle(whole.slice(0, -1));
    const b = started();
    b.e.restoreShadow(T, A, await store.listCandidates(T, A));
    await b.e.handle(whole.slice(0, -1));
    // A records the run and fails to score; then both score at once.
    await candidatesRefused(prefix, () => expect(a.e.handle(whole.slice(-1))).rejects.toThrow(/WRONGTYPE/));
    await Promise.all([a.e.handle(whole.slice(-1)), b.e.handle(whole.slice(-1))]);

    expect(await redis.lrange(`${prefix}:flows:{${T}|${A}}:outcomes`, 0, -1)).toHaveLength(1);
    expect((await store.getCandidates(T, A, ['k6'])).get('k6')).toMatchObject({ shadow_trials: 1 });
  });
});
