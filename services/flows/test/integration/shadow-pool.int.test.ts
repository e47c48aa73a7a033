import { afterAll, describe, expect, it } from 'vitest';
import { createTopics, produce, testKafka, waitFor } from '../../../../test/helpers/kafka.js';
import {
  getJson,
  isReady,
  killAll,
  serviceEnv,
  startProcess,
  type Proc,
} from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { A, T, closeFixture, record, redis, session } from './engine-fixture.js';

const procs: Proc[] = [];
afterAll(async () => {
  await killAll(procs);
  await closeFixture();
});

/*
 * A request is scored in shadow by the instance reading its session's partition; the candidate is decided by
 * the instance reading the candidates' partition. Before, an instance's shadow pool was filled from the state
 * topic only at its start, so a candidate proposed after it started was tried only on the sessions of the one
 * instance that wrote it.
 */
describe('flows: every instance tries a pending candidate in shadow, whichever instance wrote it', () => {
  it('two instances, sessions on both partitions: each session is one shadow trial', async () => {
    const stamp = Date.now();
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-pool-${stamp}`,
      PAVER_TOPIC_FLOWS: `flows-pool-${stamp}`,
      FLOWS_PROMOTION: 'auto',
      FLOWS_AUTO_MIN_OCCURRENCES: '1',
      // Never reached: every scored session stays one more trial of a pending candidate.
      FLOWS_SHADOW_TRIALS: '1000',
      FLOWS_SHADOW_PRECISION: '0',
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 2 },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, partitions: 1, compacted: true },
      { topic: env.PAVER_TOPIC_FLOW_SELECTIONS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_FLOWS!, compacted: true },
      { topic: `${env.PAVER_TOPIC_FLOWS!}.state`, compacted: true },
    ]);
    const both = [0, 1].map(() => startProcess(['bin/paver.js', 'run', 'flows'], env));
    for (const p of await Promise.all(both)) procs.push(p);
    for (const p of procs) await waitFor(() => isReady(p), 'flows /readyz');
    // Both in the group, each with one of the two tool-calls partitions.
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await waitFor(async () => {
        const g = (await admin.describeGroups([env.FLOWS_GROUP_ID!])).groups[0];
        return g?.state === 'Stable' && g.members.length === 2;
      }, 'both instances in the group');
    } finally {
      await admin.disconnect();
    }

    await produce(env.PAVER_TOPIC_FLOW_CANDIDATES!, [
      { key: `${T}/${A}/k1`, value: JSON.stringify(record('k1', 5, 1)) },
    ]);
    const pool = async (p: Proc) => {
      const r = await getJson(p.url('/metrics'));
      return parsePrometheus(String(r.body)).value('paver_flows_shadow_pool');
    };
    await waitFor(
      async () => (await pool(procs[0]!)) === 1 && (await pool(procs[1]!)) === 1,
      'the candidate in both pools',
    );

    const SESSIONS = 6;
    const lines = Array.from({ length: SESSIONS }, (_, i) =>
      session(`s${i}`).map((x) => ({
        key: `s${i}`,
        value: JSON.stringify(x.kind === 'event' ? x.e : null),
        partition: i % 2,
      })),
    ).flat();
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, lines);
    const store = new RedisFlowStore(redis, env.REDIS_KEY_PREFIX!);
    const trials = async () => (await store.getCandidates(T, A, ['k1'])).get('k1')?.shadow_trials ?? 0;
    await waitFor(async () => (await trials()) === SESSIONS, `${SESSIONS} shadow trials`);
    expect((await store.getCandidates(T, A, ['k1'])).get('k1')).toMatchObject({
      status: 'pending',
      shadow_trials: SESSIONS,
    });
  });
});
