import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import type { FlowCandidateRecord } from '../../../../schemas/index.js';
import { replay } from '../../../../cli/flows-replay.js';
import { startLlmDouble } from '../../../../test/helpers/llm-double.js';
import { consumeUntil, groupCaughtUp, produce, testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../../../../test/helpers/own-redis.js';
import {
  getJson,
  isReady,
  serviceEnv,
  startProcess,
  type Proc,
  stopPromptly,
} from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { FLOWS, stream } from './account-stream.js';
import { scopeTag } from '../../../../shared/redis/keys.js';
import { candidateStateKey, type CandidateState } from '../../src/adapters/state-feed.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
  stopOwnRedis();
});

const SCOPE = { tenant_id: 'acme', agent_id: 'support' };
const q = `tenant_id=${SCOPE.tenant_id}&agent_id=${SCOPE.agent_id}`;

const candidate = (
  key: string,
  occurrences: number,
  detectedAt: number,
  scope: { tenant_id: string; agent_id: string } = SCOPE,
): FlowCandidateRecord => ({
  schema_version: 1,
  status: 'active',
  ...scope,
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

  it('honours a SIGTERM during the start-up restore (nothing of the start goes on after it) and during a long rebuild after a loss: exits 0 at once, the batch uncommitted, the outcome memory kept, and the next start restores every candidate', async () => {
    // Before, the rebuild ran on under the stop (its writing, scope by scope, asked nothing), the batch waiting
    // for it was then handled and committed by a process told to stop, and a rebuild longer than
    // PAVER_SHUTDOWN_TIMEOUT_MS ended in exit 1. And once it did stop, it gave up before the outcome memory,
    // which no topic holds: the runs were lost for good.
    const own = await ownRedis();
    const dir = mkdtempSync(join(tmpdir(), 'paver-flows-stop-'));
    const flowsFile = join(dir, 'flows.json');
    writeFileSync(flowsFile, JSON.stringify(FLOWS));
    const env = serviceEnv({
      REDIS_URL: own.url,
      FLOWS_FILE: flowsFile,
      FLOWS_GROUP_ID: `fl-stop-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-stop-${Date.now()}`,
      FLOWS_PROMOTION: 'auto',
      FLOWS_AUTO_MIN_OCCURRENCES: '5',
      FLOWS_SHADOW_TRIALS: '0',
      PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
    });
    await createFlowsTopics(env);
    const group = env.FLOWS_GROUP_ID!;
    const candidatesTopic = env.PAVER_TOPIC_FLOW_CANDIDATES!;
    // The state topic is read once, at start, into memory: a rebuild after a loss reads no topic, and what takes
    // it a while is its writing, one transaction per scope. Many scopes of other tenants (a rejected candidate
    // each, on the topic as a decision of an earlier process): a rebuild writes them all back.
    const SCOPES = 40_000;
    const pad = Array.from({ length: SCOPES }, (_, i) => {
      const scope = { tenant_id: `other-${i}`, agent_id: 'bot' };
      const v: CandidateState = {
        schema_version: 1,
        ...scope,
        candidate: {
          record: candidate(`k${i}`, 2, 1, scope),
          status: 'rejected',
          retracted: false,
          decided_at: 1,
          shadow_trials: 0,
          shadow_proposed: 0,
          shadow_matched: 0,
        },
      };
      return { key: candidateStateKey(scope.tenant_id, scope.agent_id, `k${i}`), value: JSON.stringify(v) };
    });
    await produce(`${env.PAVER_TOPIC_FLOWS!}.state`, pad);

    const r = new Redis(own.url);
    // Every scope's candidates, registry and outcome memory as Redis holds them, values parsed (a restore writes
    // the topic's copy, whose keys may come in another order than the live write's).
    const snapshot = async () => {
      const keys: string[] = [];
      let cursor = '0';
      do {
        const [next, found] = await r.scan(cursor, 'MATCH', `${env.REDIS_KEY_PREFIX}:flows:*`, 'COUNT', 1000);
        cursor = next;
        keys.push(...found.filter((k) => /:(candidates|registry|outcomes)$/.test(k)));
      } while (cursor !== '0');
      const pipe = r.pipeline();
      for (const k of keys)
        if (k.endsWith(':outcomes')) pipe.lrange(k, 0, -1);
        else pipe.hgetall(k);
      const vals = (await pipe.exec())!.map(([, v]) => v as Record<string, string> | string[]);
      return new Map(
        keys.map((k, i) => {
          const v = vals[i]!;
          return [
            k,
            Array.isArray(v)
              ? v.map((x) => JSON.parse(x) as unknown)
              : Object.fromEntries(Object.entries(v).map(([f, x]) => [f, JSON.parse(x) as unknown])),
          ];
        }),
      );
    };
    const start = async () => {
      const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
      procs.push(p);
      return p;
    };
    const publish = (recs: FlowCandidateRecord[]) =>
      produce(
        candidatesTopic,
        recs.map((c) => ({ key: c.dedupe_key, value: JSON.stringify(c) })),
      );

    // A stop during the start-up restore: start() must end there. Before, it went on to fetch the flows'
    // embeddings and set the refresh timers after the stop, on a service being closed (its clients with it).
    const llm = await startLlmDouble(() => ({ content: '[]' }));
    try {
      const interrupted = await startProcess(['bin/paver.js', 'run', 'flows'], {
        ...env,
        FLOWS_EMBEDDINGS_URL: llm.url,
      });
      procs.push(interrupted);
      // The restore writes scope after scope into this empty Redis.
      await waitFor(async () => (await r.dbsize()) > 100, 'the start-up restore under way', 120_000);
      const code = await stopPromptly(interrupted);
      expect(code, interrupted.output().slice(-3000)).toBe(0);
      expect(interrupted.output()).toContain('redis state rebuild stopped by the stop');
      expect(interrupted.output()).not.toContain('flows state restored to redis');
      expect(llm.requests.filter((req) => req.path.endsWith('/embeddings'))).toEqual([]);
    } finally {
      await llm.close();
    }

    const first = await start();
    await waitFor(() => isReady(first), 'flows /readyz (the start rebuild written)', 120_000);
    await publish([candidate('hot', 10, 1), candidate('bad', 3, 1), candidate('cold', 2, 1)]);
    await waitFor(async () => (await candidates(first)).length === 3, 'three candidates stored');
    expect((await fetch(first.url(`/flows/candidates/bad/reject?${q}`), { method: 'POST' })).status).toBe(
      200,
    );
    const before = await candidates(first);
    expect(before).toEqual([
      { key: 'bad', status: 'rejected' },
      { key: 'cold', status: 'pending' },
      { key: 'hot', status: 'promoted' },
    ]);
    const registryBefore = await registry(first);
    expect(registryBefore).toHaveLength(1);
    await waitFor(() => groupCaughtUp(group, candidatesTopic), 'the candidates committed');
    // Runs of the hand-written flows: the outcome memory, which lives in Redis and in this process only.
    const { lines } = stream();
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      lines.map((l) => ({ key: (JSON.parse(l) as { session_id: string }).session_id, value: l })),
    );
    await waitFor(() => groupCaughtUp(group, env.PAVER_TOPIC_TOOL_CALLS!), 'the runs consumed');
    const whole = await snapshot();
    const memory = [...whole].filter(([k]) => k.endsWith(':outcomes'));
    expect(memory).toHaveLength(1);
    expect((memory[0]![1] as unknown[]).length).toBeGreaterThan(3);
    // Every other tenant's scope, acme's candidates and registry, and the outcome memory.
    expect(whole.size).toBe(SCOPES + 3);

    await r.flushall();
    // Its batch finds the state gone and waits for the rebuild.
    await publish([candidate('late', 2, 2)]);
    const lost = 'redis state lost (epoch marker gone); rebuilding from kafka';
    // Under way: the loss seen, and the rebuild writing back (the marker is the one key before it).
    await waitFor(
      async () => first.output().includes(lost) && (await r.dbsize()) > 1,
      'the rebuild under way',
    );
    // A read of the candidates waits for the rebuild too: the stop that gives it up answers it 503 (retry
    // elsewhere), not 500 as if the service were broken.
    const during = fetch(first.url(`/flows/candidates?${q}`)).then((res) => res.status);
    // Far below PAVER_SHUTDOWN_TIMEOUT_MS: the stop did not wait for its work.
    const code = await stopPromptly(first);
    const afterLoss = first.output().slice(first.output().indexOf(lost));
    expect(code, afterLoss.slice(-3000)).toBe(0);
    expect(afterLoss).not.toContain('flows state restored to redis');
    expect(afterLoss).toContain('redis state rebuild stopped by the stop');
    expect(await during).toBe(503);
    expect(afterLoss).not.toContain('http handler failed');
    // The rebuild was cut short, and the batch that waited for it was given back.
    const cut = await snapshot();
    expect(cut.size).toBeLessThan(whole.size);
    // What no topic holds was written back before the rebuild gave up.
    expect(cut.get(memory[0]![0])).toEqual(memory[0]![1]);
    expect(await groupCaughtUp(group, candidatesTopic)).toBe(false);

    const second = await start();
    await waitFor(() => isReady(second), 'flows /readyz after the restart', 120_000);
    await waitFor(
      () => groupCaughtUp(group, candidatesTopic),
      'the candidate after the loss handled after the restart',
    );
    expect(await candidates(second)).toEqual(
      [...before, { key: 'late', status: 'pending' }].sort((a, b) => a.key.localeCompare(b.key)),
    );
    expect(await registry(second)).toEqual(registryBefore);
    // Every scope back as it was before the loss, but for the candidate that came after it.
    const restored = await snapshot();
    const acme = restored.get(
      `${env.REDIS_KEY_PREFIX}:flows:${scopeTag(SCOPE.tenant_id, SCOPE.agent_id)}:candidates`,
    ) as Record<string, unknown>;
    delete acme.late;
    expect(restored).toEqual(whole);
    r.disconnect();
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
  }, 300_000);
});
