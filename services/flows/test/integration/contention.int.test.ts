import { afterAll, describe, expect, it } from 'vitest';
import { consumeUntil, type Consumed } from '../../../../test/helpers/kafka.js';
import type { CandidateStore } from '../../src/adapters/engine.js';
import { candidateStateKey } from '../../src/adapters/state-feed.js';
import { promotedFlowId } from '../../src/core/registry.js';
import { A, T, closeFixture, engine, place, record, redis, session } from './engine-fixture.js';

/*
 * Several writers decide one candidate: every instance's detector records and shadow outcomes (sessions are
 * spread over partitions, candidates are per scope) and the operator's HTTP calls. These tests put a second
 * writer's whole decision between one writer's read and its write, on a real Redis, and check that neither
 * undoes the other. Before the write became a compare-and-set, the reject was undone and a shadow trial lost.
 */

afterAll(closeFixture);

/**
 * A store whose first write (with candidates) first lets `between` run to its end: a race, made certain. With
 * `afterRead`, `between` runs right after the first read of `afterRead` instead (before anything is published).
 */
function racing(store: CandidateStore, between: () => Promise<void>, afterRead?: string): CandidateStore {
  let armed = true;
  return {
    async read(t, a, keys) {
      const r = await store.read(t, a, keys);
      if (armed && afterRead && keys.includes(afterRead)) {
        armed = false;
        await between();
      }
      return r;
    },
    flows: (t, a, ids) => store.flows(t, a, ids),
    async write(t, a, read, candidates, flows) {
      if (armed && !afterRead && candidates.length) {
        armed = false;
        await between();
      }
      return store.write(t, a, read, candidates, flows);
    },
  };
}

/** The last record per key of a topic, read from its beginning once `done` holds. */
async function lastByKey(topic: string, done: (all: Consumed[]) => boolean) {
  const last = new Map<string, Buffer | null>();
  // What a test waits for is on the topic before it looks (every send was acknowledged): 30 s is ample.
  for (const m of await consumeUntil(topic, done, 30_000)) last.set(m.key ?? '', m.value);
  return last;
}

describe('flows: one candidate decided by several writers at once (real Redis and Kafka)', () => {
  it("an operator's reject between a promotion's read and its write stands; the flow published for it is withdrawn", async () => {
    const { prefix, flowsTopic, policy, store, other } = await place({
      minOccurrences: 10,
      shadowTrials: 0,
      shadowPrecision: 0,
    });
    const operator = engine(other, policy, flowsTopic);
    const worker = engine(
      racing(store, async () => {
        const r = await operator.e.decide(T, A, 'k1', 'reject');
        expect(r.outcome.kind).toBe('rejected');
      }),
      policy,
      flowsTopic,
    );
    // Pending below the bar (the racing store lets this first write through untouched: nothing to race yet).
    await operator.e.handle([{ kind: 'candidate', r: record('k1', 3, 1) }]);
    // The detector's next count clears the bar: the worker promotes, but the operator rejects in between.
    await worker.e.handle([{ kind: 'candidate', r: record('k1', 20, 2) }]);

    const stored = await store.getCandidates(T, A, ['k1']);
    expect(stored.get('k1')).toMatchObject({ status: 'rejected', record: { occurrence_count: 20 } });
    expect(await redis.hlen(`${prefix}:flows:{${T}|${A}}:registry`)).toBe(0);
    expect(worker.seen.contention).toBe(1);
    expect(worker.e.shadow.list(T, A)).toEqual([]);
    // The first attempt published the flow before losing; the topic ends with its tombstone.
    const id = promotedFlowId(T, A, 'k1');
    const onTopic = await consumeUntil(flowsTopic, (all) => all.some((m) => m.value === null));
    expect(onTopic.map((m) => [m.key, m.value === null])).toEqual([
      [id, false],
      [id, true],
    ]);
  });

  it('shadow outcomes two instances count at the same moment are both counted', async () => {
    // Shadow trials on, a bar never reached: every finished session's shadow choice is one more trial.
    const { flowsTopic, policy, store, other } = await place({
      minOccurrences: 1,
      shadowTrials: 1000,
      shadowPrecision: 0,
    });
    const b = engine(other, policy, flowsTopic);
    const a = engine(
      racing(store, () => b.e.handle(session('s-b')).then(() => undefined)),
      policy,
      flowsTopic,
    );
    await b.e.handle([{ kind: 'candidate', r: record('k2', 5, 1) }]);
    a.e.restoreShadow(T, A, await store.listCandidates(T, A));
    expect(a.e.shadow.list(T, A)).toHaveLength(1);

    await a.e.handle(session('s-a'));

    const c = (await store.getCandidates(T, A, ['k2'])).get('k2');
    expect(c).toMatchObject({ status: 'pending', shadow_trials: 2, shadow_proposed: 4, shadow_matched: 4 });
    expect(a.seen.contention).toBe(1);
  });

  it('the state topic ends with the state that landed, even when the losing writer then has nothing to write', async () => {
    // A counts a shadow trial on a pending candidate; the operator rejects it in between. A's first attempt sent
    // "pending, one more trial" to the state topic before losing; its second decides nothing (not pending).
    const { stateTopic, flowsTopic, policy, store, other } = await place({
      minOccurrences: 1,
      shadowTrials: 1000,
      shadowPrecision: 0,
    });
    const operator = engine(other, policy, flowsTopic);
    const a = engine(
      racing(store, async () => void (await operator.e.decide(T, A, 'k3', 'reject'))),
      policy,
      flowsTopic,
    );
    await operator.e.handle([{ kind: 'candidate', r: record('k3', 5, 1) }]);
    a.e.restoreShadow(T, A, await store.listCandidates(T, A));
    await a.e.handle(session('s-c'));

    expect((await store.getCandidates(T, A, ['k3'])).get('k3')).toMatchObject({
      status: 'rejected',
      shadow_trials: 0,
    });
    const key = candidateStateKey(T, A, 'k3');
    // pending (operator) → rejected (operator) → pending + 1 trial (A, lost) → rejected (A, written again).
    const last = await lastByKey(stateTopic, (all) => all.filter((m) => m.key === key).length >= 4);
    expect(JSON.parse(String(last.get(key)))).toMatchObject({ candidate: { status: 'rejected' } });
  });

  it("a promotion that loses to another writer's promotion leaves that writer's flow on the topic", async () => {
    const { flowsTopic, policy, store, other } = await place({
      minOccurrences: 10,
      shadowTrials: 0,
      shadowPrecision: 0,
    });
    // Different clocks: the two writers' flows differ (registered_at), so the topic says whose it kept.
    const operator = engine(other, policy, flowsTopic, () => 1_000);
    const worker = engine(
      racing(store, async () => void (await operator.e.decide(T, A, 'k4', 'promote')), 'k4'),
      policy,
      flowsTopic,
      () => 2_000,
    );
    await operator.e.handle([{ kind: 'candidate', r: record('k4', 3, 1) }]);
    await worker.e.handle([{ kind: 'candidate', r: record('k4', 20, 2) }]);

    const id = promotedFlowId(T, A, 'k4');
    const [stored] = await store.flows(T, A, [id]);
    expect(stored).toMatchObject({ id, registered_at: 1_000 });
    // operator (before and after its write), worker (lost), then the stored flow again.
    const last = await lastByKey(flowsTopic, (all) => all.length >= 4);
    expect(JSON.parse(String(last.get(id)))).toMatchObject({ flow: { registered_at: 1_000 } });
  });
});
