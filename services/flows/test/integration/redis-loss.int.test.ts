import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { FlowCandidateRecord } from '../../../../schemas/index.js';
import { replay } from '../../../../cli/flows-replay.js';
import { consumeUntil, groupCaughtUp, produce, testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { FLOWS, stream } from './account-stream.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
});

const SCOPE = { tenant_id: 'acme', agent_id: 'support' };
const q = `tenant_id=${SCOPE.tenant_id}&agent_id=${SCOPE.agent_id}`;

const candidate = (key: string, occurrences: number, detectedAt: number): FlowCandidateRecord => ({
  schema_version: 1,
  status: 'active',
  ...SCOPE,
  dedupe_key: key,
  detected_at: detectedAt,
  title: `flow ${key}`,
  source_kind: 'tool_sequence',
  occurrence_count: occurrences,
  estimated_token_savings: 10,
  candidate: null,
  promotion_effect: {
    effect_type: 'flow_offload_registration',
    proposed_flow: {
      name: `flow_${key}`,
      description: `Auto: ${key}`,
      steps: [
        {
          id: 's1',
          name: 'Step',
          skill_key: `tool_${key}`,
          depends_on: [],
          output_key: 'o1',
          retry_max: 0,
          retry_backoff: 0,
          timeout_seconds: 30,
          on_failure: 'stop',
          input_map: {},
        },
      ],
      tags: ['auto'],
    },
    agent_prompt_hint: `Run flow_${key}`,
    reason: `seen ${occurrences} times`,
  },
});

type Summary = { dedupe_key: string; status: string };
const candidates = async (p: Proc) => {
  const r = await getJson(p.url(`/flows/candidates?${q}`));
  return (r.body as Summary[])
    .map((c) => ({ key: c.dedupe_key, status: c.status }))
    .sort((a, b) => a.key.localeCompare(b.key));
};
const registry = async (p: Proc) =>
  ((await getJson(p.url(`/flows?${q}`))).body as { id: string }[]).map((f) => f.id).sort();
const rebuilds = async (p: Proc, reason: string) =>
  parsePrometheus((await getJson(p.url('/metrics'))).body as string).value(
    'paver_flows_state_rebuilds_total',
    {
      reason,
      outcome: 'ok',
    },
  );

describe('flows service: Redis state lost mid-stream', () => {
  it('rebuilds candidates (decisions included), registry and outcome memory from Kafka; /readyz false meanwhile', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-flows-loss-'));
    const flowsFile = join(dir, 'flows.json');
    const input = join(dir, 'stream.jsonl');
    writeFileSync(flowsFile, JSON.stringify(FLOWS));
    const { lines, requests } = stream();
    writeFileSync(input, lines.join('\n') + '\n');
    // Split at a run boundary: the second half's choices depend on the first half's outcomes.
    const split = lines.findIndex((l) => l.includes('"run-7:user"'));
    const firstRequests = lines.slice(0, split).filter((l) => l.includes('"user_message"')).length;

    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-${Date.now()}`,
      FLOWS_FILE: flowsFile,
      FLOWS_PROMOTION: 'auto',
      FLOWS_AUTO_MIN_OCCURRENCES: '5',
      FLOWS_SHADOW_TRIALS: '0',
    });
    await createFlowsTopics(env, 1);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');

    // Candidates: one promoted automatically, one rejected by an operator, one left pending.
    const publish = (recs: FlowCandidateRecord[]) =>
      produce(
        env.PAVER_TOPIC_FLOW_CANDIDATES!,
        recs.map((r) => ({ key: r.dedupe_key, value: JSON.stringify(r) })),
      );
    await publish([candidate('hot', 10, 1), candidate('bad', 3, 1), candidate('cold', 2, 1)]);
    await waitFor(async () => (await candidates(p)).length === 3, 'three candidates stored');
    expect((await fetch(p.url(`/flows/candidates/bad/reject?${q}`), { method: 'POST' })).status).toBe(200);
    const before = await candidates(p);
    expect(before).toEqual([
      { key: 'bad', status: 'rejected' },
      { key: 'cold', status: 'pending' },
      { key: 'hot', status: 'promoted' },
    ]);
    const registryBefore = await registry(p);
    expect(registryBefore).toHaveLength(1);

    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      lines
        .slice(0, split)
        .map((l) => ({ key: (JSON.parse(l) as { session_id: string }).session_id, value: l })),
    );
    await consumeUntil(env.PAVER_TOPIC_FLOW_SELECTIONS!, (all) => all.length >= firstRequests);
    await waitFor(
      () => groupCaughtUp(env.FLOWS_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'first half consumed',
    );

    // Redis loses everything. The next readiness probe finds the epoch marker gone and starts the rebuild.
    await redis.flushall();
    await waitFor(async () => !(await isReady(p)), '/readyz false once the state is gone');
    await waitFor(() => isReady(p), '/readyz true after the rebuild');
    expect(await rebuilds(p, 'lost')).toBe(1);
    expect(await candidates(p)).toEqual(before);
    expect(await registry(p)).toEqual(registryBefore);

    // The detector republishes the rejected candidate: it stays rejected (the decision survived the loss).
    await publish([candidate('bad', 30, 2)]);
    await waitFor(
      () => groupCaughtUp(env.FLOWS_GROUP_ID!, env.PAVER_TOPIC_FLOW_CANDIDATES!),
      'republished candidate consumed',
    );
    expect(await candidates(p)).toEqual(before);

    // A restart after the loss: the outcome memory the rebuild wrote back is what the new process starts from.
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
    const p2 = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p2);
    await waitFor(() => isReady(p2), 'restarted flows /readyz');
    expect(await candidates(p2)).toEqual(before);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      lines
        .slice(split)
        .map((l) => ({ key: (JSON.parse(l) as { session_id: string }).session_id, value: l })),
    );
    const got = await consumeUntil(env.PAVER_TOPIC_FLOW_SELECTIONS!, (all) => all.length >= requests);
    const live = new Map(
      got.map((m) => {
        const v = JSON.parse(m.value!.toString()) as { event_id: string; chosen: { id: string }[] };
        return [v.event_id, v.chosen.map((c) => c.id)] as const;
      }),
    );
    const reference = await replay({ input, flows: flowsFile, promotion: { mode: 'manual' }, env: {} });
    expect(live).toEqual(new Map(reference.choices.map((c) => [c.event_id, c.chosen] as const)));

    // Not vacuous: without the first half's outcomes the second half is chosen differently.
    const secondOnly = join(dir, 'second.jsonl');
    writeFileSync(secondOnly, lines.slice(split).join('\n') + '\n');
    const forgetful = await replay({
      input: secondOnly,
      flows: flowsFile,
      promotion: { mode: 'manual' },
      env: {},
    });
    const fromReference = reference.choices.slice(firstRequests).map((c) => c.chosen.join(','));
    expect(forgetful.choices.map((c) => c.chosen.join(','))).not.toEqual(fromReference);

    p2.child.kill('SIGTERM');
    expect(await p2.exited).toBe(0);
  });
});
