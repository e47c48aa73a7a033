import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { RegisteredFlow } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { groupCaughtUp, produce, testKafka, unique, waitFor } from '../../../../test/helpers/kafka.js';
import {
  getJson,
  isReady,
  killAll,
  serviceEnv,
  startProcess,
  type Proc,
} from '../../../../test/helpers/process.js';
import { flowFromCandidate, promotedFlowId, unscopedPromotedFlowId } from '../../src/core/registry.js';
import { dedupeKeyOf, detectorRecord } from '../detector-record.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
afterEach(() => killAll(procs));
const sink = createSink(testKafka(), jsonCodec());
afterAll(() => sink.disconnect());

describe('promoted flow ids per scope (real Kafka/Redis, the service process)', () => {
  it('two agents promoting the same tool sequence keep a flow each; one promoted before under the unscoped id keeps its id', async () => {
    const env = serviceEnv({ FLOWS_GROUP_ID: unique('fl'), PAVER_TOPIC_FLOWS: unique('flows') });
    await createFlowsTopics(env, 1);
    const tools = ['get_user_details', 'get_reservation_details'];
    const key = dedupeKeyOf(tools);
    const recs = ['a', 'b'].map((agent) => detectorRecord(tools, { agent, at: Date.now() }));
    // Agent a's flow as a version before scoped ids promoted it: on the topic under the unscoped id.
    const legacy: RegisteredFlow = flowFromCandidate(
      recs[0]!,
      Date.now(),
      undefined,
      unscopedPromotedFlowId(key),
    );
    await sink.connect();
    await sink.send(env.PAVER_TOPIC_FLOWS!, 'flows.v1', [
      { key: legacy.id, value: { schema_version: 1, flow: legacy } },
    ]);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');
    const listed = async (agent: string) =>
      ((await getJson(p.url(`/flows?agent_id=${agent}`))).body as { id: string }[]).map((f) => f.id);
    expect(await listed('a')).toEqual([legacy.id]);
    await produce(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      recs.map((r) => ({ key: `default/${r.agent_id}/${r.dedupe_key}`, value: JSON.stringify(r) })),
    );
    for (const agent of ['a', 'b'])
      await waitFor(
        async () =>
          ((await getJson(p.url(`/flows/candidates?agent_id=${agent}`))).body as unknown[]).length === 1,
        `candidate stored for ${agent}`,
      );
    const promote = async (agent: string) => {
      const res = await fetch(
        p.url(`/flows/candidates/${encodeURIComponent(key)}/promote?agent_id=${agent}`),
        {
          method: 'POST',
        },
      );
      return { status: res.status, id: ((await res.json()) as { flow?: { id: string } }).flow?.id };
    };
    // a's re-promotion replaces its flow (no second one beside it); b's gets its own id. Before, both were the
    // unscoped id, and b's promotion took a's flow away (the registry moved the id to b's scope).
    expect(await promote('a')).toEqual({ status: 200, id: legacy.id });
    expect(await promote('b')).toEqual({ status: 200, id: promotedFlowId('default', 'b', key) });
    // The registry feed applies the flows topic's records too (before, b's record took a's flow away): wait until
    // it has read the topic to its end. Its group commits after each applied chunk, under a name of its own.
    await waitFor(async () => {
      const admin = testKafka().admin();
      await admin.connect();
      try {
        const { groups } = await admin.listGroups();
        const feeds = groups.filter((g) => g.groupId.startsWith(`${env.FLOWS_GROUP_ID}-table-`));
        for (const g of feeds) if (await groupCaughtUp(g.groupId, env.PAVER_TOPIC_FLOWS!)) return true;
        return false;
      } finally {
        await admin.disconnect();
      }
    }, 'registry feed read the flows topic to its end');
    expect({ a: await listed('a'), b: await listed('b') }).toEqual({
      a: [legacy.id],
      b: [promotedFlowId('default', 'b', key)],
    });
  });
});
