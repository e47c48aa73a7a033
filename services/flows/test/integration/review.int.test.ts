import { afterEach, describe, expect, it } from 'vitest';
import { dedupeKeyOf, detectorRecord as record } from '../detector-record.js';
import { produce, unique, waitFor } from '../../../../test/helpers/kafka.js';
import {
  getJson,
  isReady,
  killAll,
  serviceEnv,
  startProcess,
  type Proc,
} from '../../../../test/helpers/process.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
afterEach(() => killAll(procs));

const detectorRecord = (tools: string[], agent: string) => record(tools, { agent, at: Date.now() });

describe('review (real Kafka/Redis, the service process)', () => {
  // Fails until the defect it shows is fixed (a later commit).
  it.fails('promoting the same tool sequence for two agents keeps each agent its flow', async () => {
    const env = serviceEnv({ FLOWS_GROUP_ID: unique('fl'), PAVER_TOPIC_FLOWS: unique('flows') });
    await createFlowsTopics(env, 1);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');
    const tools = ['get_user_details', 'get_reservation_details'];
    const recs = ['a', 'b'].map((agent) => detectorRecord(tools, agent));
    await produce(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      recs.map((r) => ({ key: `default/${r.agent_id}/${r.dedupe_key}`, value: JSON.stringify(r) })),
    );
    const key = encodeURIComponent(dedupeKeyOf(tools));
    for (const agent of ['a', 'b'])
      await waitFor(
        async () =>
          ((await getJson(p.url(`/flows/candidates?agent_id=${agent}`))).body as unknown[]).length === 1,
        `candidate stored for ${agent}`,
      );
    for (const agent of ['a', 'b'])
      expect(
        (await fetch(p.url(`/flows/candidates/${key}/promote?agent_id=${agent}`), { method: 'POST' })).status,
      ).toBe(200);
    // Let the registry feed apply the topic's records too.
    await new Promise((r) => setTimeout(r, 3_000));
    const listed = async (agent: string) =>
      ((await getJson(p.url(`/flows?agent_id=${agent}`))).body as unknown[]).length;
    expect({ a: await listed('a'), b: await listed('b') }).toEqual({ a: 1, b: 1 });
  });
});
