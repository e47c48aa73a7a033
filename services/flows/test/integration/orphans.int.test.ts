import { afterAll, describe, expect, it } from 'vitest';
import { consumeUntil, produce, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { flowFromCandidate, promotedFlowId } from '../../src/core/registry.js';
import { A, T, closeFixture, engine, place, record, sink } from './engine-fixture.js';
import { createFlowsTopics } from './service-topics.js';

/*
 * A promotion publishes its flow before its write. A process that dies in between leaves the flow on the topic,
 * and if the candidate is then decided otherwise (an operator's reject), every instance would go on offering a
 * flow nobody promoted: the reconciliation that would withdraw it was owed in the dead process's memory. The
 * service now checks the topic's promoted flows against the candidates' states on a timer and withdraws those.
 */

const procs: Proc[] = [];
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await closeFixture();
});

const q = `tenant_id=${T}&agent_id=${A}`;

describe('flows: promoted flows the candidates do not back are withdrawn (real Redis and Kafka)', () => {
  it('the service withdraws a flow left on the topic by a promoter that died, once its candidate was rejected', async () => {
    const env = serviceEnv({
      FLOWS_GROUP_ID: unique('fl'),
      PAVER_TOPIC_FLOWS: unique('flows'),
      FLOWS_PROMOTION: 'manual',
      FLOWS_RECONCILE_MS: '300',
      FLOWS_RECONCILE_MIN_AGE_MS: '60000',
    });
    await createFlowsTopics(env, 1);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');

    const records = [record('kept', 5, 1), record('orphan', 5, 1)];
    await produce(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      records.map((r) => ({ key: r.dedupe_key, value: JSON.stringify(r) })),
    );
    const stored = async () =>
      ((await getJson(p.url(`/flows/candidates?${q}`))).body as { dedupe_key: string }[]).length;
    await waitFor(async () => (await stored()) === 2, 'two candidates stored');
    const decide = (key: string, to: string) =>
      fetch(p.url(`/flows/candidates/${key}/${to}?${q}`), { method: 'POST' }).then((r) => r.status);
    expect(await decide('kept', 'promote')).toBe(200);
    expect(await decide('orphan', 'reject')).toBe(200);

    // What a promoter that died between its publication and its write left: the flow, promoted ten minutes ago.
    const orphan = flowFromCandidate(records[1]!, Date.now() - 600_000);
    expect(orphan.id).toBe(promotedFlowId(T, A, 'orphan'));
    await sink.connect();
    await sink.send(env.PAVER_TOPIC_FLOWS!, 'flows.v1', [
      { key: orphan.id, value: { schema_version: 1, flow: orphan } },
    ]);

    const listed = async () =>
      ((await getJson(p.url(`/flows?${q}`))).body as { id: string }[]).map((f) => f.id).sort();
    await waitFor(async () => {
      const ids = await listed();
      return ids.length === 1 && ids[0] === promotedFlowId(T, A, 'kept');
    }, 'the orphan withdrawn from the registry');
    const onTopic = await consumeUntil(env.PAVER_TOPIC_FLOWS!, (all) =>
      all.some((m) => m.key === orphan.id && m.value === null),
    );
    // The promoted flow stays, as its last record.
    const last = new Map(onTopic.map((m) => [m.key, m.value]));
    expect(last.get(promotedFlowId(T, A, 'kept'))).not.toBeNull();
    // The reconciliation counts what it withdrew once the whole run is over, after the tombstone and the registry
    // change seen above.
    const withdrawn = async () =>
      parsePrometheus((await getJson(p.url('/metrics'))).body as string).value(
        'paver_flows_orphans_withdrawn_total',
        {},
      );
    await waitFor(async () => (await withdrawn()) >= 1, 'the withdrawn orphan counted');
    expect(await withdrawn()).toBe(1);
  });

  it('leaves young flows (a promotion on its way to Redis), backed ones and those with no stored candidate', async () => {
    const { flowsTopic, policy, store } = await place({
      minOccurrences: 100,
      shadowTrials: 0,
      shadowPrecision: 0,
    });
    const now = 10_000_000;
    const { e } = engine(store, policy, flowsTopic, () => now);
    await e.handle([
      { kind: 'candidate', r: record('pending-young', 5, 1) },
      { kind: 'candidate', r: record('pending-old', 5, 1) },
    ]);
    const flows = [
      flowFromCandidate(record('pending-young', 5, 1), now - 1_000),
      flowFromCandidate(record('pending-old', 5, 1), now - 120_000),
      flowFromCandidate(record('never-stored', 5, 1), now - 120_000),
    ];
    expect(await e.reconcileRegistry(flows, 60_000)).toBe(1);
    const topic = await consumeUntil(flowsTopic, (all) => all.length >= 1);
    expect(topic.map((m) => [m.key, m.value])).toEqual([[promotedFlowId(T, A, 'pending-old'), null]]);
  });
});
