import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'yaml';
import { afterAll, describe, expect, it } from 'vitest';
import { flowSelectionRecordV1, nextActionRecordV1, sequenceStateRecordV1 } from '../../schemas/index.js';
import { consumeUntil, createTopics, produce, waitFor } from '../helpers/kafka.js';
import { startLlmDouble } from '../helpers/llm-double.js';
import {
  getJson,
  isReady,
  ROOT,
  serviceEnv,
  startProcess,
  stopPromptly,
  type Proc,
} from '../helpers/process.js';
import { agentEvents } from '../../testkit/streams.js';

const procs: Proc[] = [];
let closeDouble: (() => Promise<void>) | null = null;
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await closeDouble?.();
});

/**
 * Above what this test's waits may take together on a starved machine (the topics 120 s, readiness 60 s, the
 * candidate 90 s, three topic reads 120 s each, the stop 30 s), which the integration testTimeout (300 s) is not:
 * cut by it, the test said neither what it awaited nor what it had read.
 */
const TEST_MS = 600_000;

async function start(name: string, env: Record<string, string>, timeoutMs: number) {
  const p = await startProcess(['bin/paver.js', 'run', name], env);
  procs.push(p);
  await waitFor(() => isReady(p), `${name} /readyz`, timeoutMs).catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output()}`);
  });
  return p;
}

describe('the whole loop: tool calls → candidate → promotion → selection', { timeout: TEST_MS }, () => {
  it('runs through every Paver service on real Kafka and Redis, with a model double', async () => {
    // Every wait gives up by then, and says what it awaited: a minute is kept for the stop (30 s) and for what a
    // wait that gave up still does (a reader's disconnect) before the test's own timeout.
    const until = Date.now() + TEST_MS - 60_000;
    const left = (ms: number) => Math.max(0, Math.min(ms, until - Date.now()));
    let promotedName = '';
    const llm = await startLlmDouble((body) => {
      const user = body.messages.find((m) => m.role === 'user')?.content ?? '';
      // Pick the promoted flow from the candidates block, answered in a code fence with prose around it.
      const m = new RegExp(`<flow id="([^"]+)"><name>${promotedName}</name>`).exec(user);
      return { content: m ? `Here you go:\n\`\`\`json\n["${m[1]}"]\n\`\`\`` : '[]' };
    });
    closeDouble = llm.close;
    // The stream below is agent-0's: its hand-written flows are the example file's, in that scope.
    const flowsFile = join(mkdtempSync(join(tmpdir(), 'paver-e2e-')), 'flows.json');
    const examples = parse(readFileSync(`${ROOT}examples/flows.yaml`, 'utf8')) as Record<string, unknown>[];
    writeFileSync(flowsFile, JSON.stringify(examples.map((f) => ({ ...f, agent_id: 'agent-0' }))));
    const scope = '?tenant_id=default&agent_id=agent-0';
    // The sequencer's orchestration for agent-0 too (an agent with none, on events without visible_tools, is
    // published nothing).
    const orchestrationFile = join(mkdtempSync(join(tmpdir(), 'paver-e2e-')), 'orchestration.json');
    const orchestration = parse(readFileSync(`${ROOT}examples/orchestration.yaml`, 'utf8')) as object;
    writeFileSync(orchestrationFile, JSON.stringify({ ...orchestration, agent_id: 'agent-0' }));
    const env = serviceEnv({
      PAVER_TOPIC_TOOL_CATALOG: `cat-${Date.now()}`,
      PAVER_TOPIC_ORCHESTRATION: `orch-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-${Date.now()}`,
      AUTOSEQ_GROUP_ID: `aseq-${Date.now()}`,
      SEQUENCER_GROUP_ID: `seq-${Date.now()}`,
      FLOWS_GROUP_ID: `flows-${Date.now()}`,
      AUTOSEQ_CATALOG_FILE: `${ROOT}examples/catalog.yaml`,
      SEQUENCER_CONFIG_FILE: orchestrationFile,
      FLOWS_FILE: flowsFile,
      FLOWS_CHAT_URL: llm.url,
      FLOWS_CHAT_API_KEY: 'test-key-never-logged',
      DETECTOR_LOOKBACK: '100',
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_NEXT_ACTIONS! },
      { topic: env.PAVER_TOPIC_SEQUENCE_STATE! },
      { topic: env.PAVER_TOPIC_FLOW_SELECTIONS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_TOOL_CATALOG!, compacted: true },
      { topic: env.PAVER_TOPIC_ORCHESTRATION!, compacted: true },
      { topic: env.PAVER_TOPIC_FLOWS!, compacted: true },
    ]);
    const [, , , flows] = await Promise.all(
      ['detector', 'autoseq', 'sequencer', 'flows'].map((s) => start(s, env, left(60_000))),
    );

    // 1. Agents' tool calls: recurring workflows, among them web_search → http_get → parse_json → summarize.
    const events = [...agentEvents({ tasks: 200, seed: 3 })];
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      events.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
    );

    // 2. The detector's candidates reach the flows service and wait for a person (manual promotion by default).
    type Summary = { dedupe_key: string; status: string };
    // 3. Promotion over HTTP puts it in the registry (and on the flows topic). The stream is still being read: a
    // candidate listed pending may be retracted by the detector before the promotion lands (409), and then another
    // one is taken, as an operator would.
    const res = await waitFor(
      async () => {
        const list = (await getJson(flows!.url(`/flows/candidates${scope}`))).body as Summary[];
        for (const c of list) {
          const detail = (
            await getJson(flows!.url(`/flows/candidates/${encodeURIComponent(c.dedupe_key)}${scope}`))
          ).body as { record: { candidate: { tool_sequence: string[] } | null } };
          if (c.status !== 'pending' || !detail.record.candidate?.tool_sequence.includes('http_get'))
            continue;
          const promoted = await fetch(
            flows!.url(`/flows/candidates/${encodeURIComponent(c.dedupe_key)}/promote${scope}`),
            { method: 'POST' },
          );
          if (promoted.status !== 409) return promoted;
        }
        return null;
      },
      'a pending candidate with the web research workflow, promoted',
      left(90_000),
    );
    expect(res.status).toBe(200);
    const { flow } = (await res.json()) as { flow: { id: string; name: string; agent_prompt_hint?: string } };
    promotedName = flow.name;
    expect(flow.agent_prompt_hint).toBeTruthy();
    const registryList = (await getJson(flows!.url(`/flows${scope}`))).body as {
      id: string;
      source: string;
    }[];
    expect(registryList).toContainEqual(expect.objectContaining({ id: flow.id, source: 'promoted' }));

    // 4. A matching user message selects it: several candidates (the hand-written research flow competes), the model picks.
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
      {
        key: 'new-session',
        value: JSON.stringify({
          type: 'user_message',
          event_id: 'um-1',
          ts: Date.now(),
          agent_id: 'agent-0',
          session_id: 'new-session',
          text: 'web search then http get, parse the json and summarize it',
          episode_summaries: ['The user researches APIs.'],
        }),
      },
    ]);
    const sel = await consumeUntil(
      env.PAVER_TOPIC_FLOW_SELECTIONS!,
      (all) => all.some((m) => JSON.parse(m.value!.toString()).event_id === 'um-1'),
      left(120_000),
    );
    const record = flowSelectionRecordV1.parse(
      JSON.parse(sel.find((m) => JSON.parse(m.value!.toString()).event_id === 'um-1')!.value!.toString()),
    );
    expect(record.candidates.length).toBeGreaterThan(1);
    expect(record).toMatchObject({
      path: 'model',
      chosen: [{ id: flow.id, name: flow.name }],
      unresolved_ids: [],
    });
    expect(record.combined_prompt).toContain(`<flow id="${flow.id}"`);
    expect(
      llm.requests.some(
        (r) => r.path === '/v1/chat/completions' && r.auth === 'Bearer test-key-never-logged',
      ),
    ).toBe(true);

    // 5. The other services saw the same stream.
    const actions = await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => all.length > 0, left(120_000));
    expect(() => nextActionRecordV1.parse(JSON.parse(actions[0]!.value!.toString()))).not.toThrow();
    const states = await consumeUntil(
      env.PAVER_TOPIC_SEQUENCE_STATE!,
      (all) => all.length > 0,
      left(120_000),
    );
    expect(() => sequenceStateRecordV1.parse(JSON.parse(states[0]!.value!.toString()))).not.toThrow();

    // No key, prompt or model answer in any service's logs.
    for (const p of procs) expect(p.output()).not.toMatch(/test-key-never-logged|Here you go|<candidates>/);
    // SIGTERM, then each exit within 30 s, else the process's last output: a stop that hung waited for the
    // test's timeout, naming no process.
    expect(await Promise.all(procs.map((p) => stopPromptly(p)))).toEqual([0, 0, 0, 0]);
  });
});
