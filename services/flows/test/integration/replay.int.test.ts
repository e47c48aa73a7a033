import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { replay } from '../../../../cli/flows-replay.js';
import { consumeUntil, groupCaughtUp, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, PAVER_BIN, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import {
  toolCallsEventV1,
  type FlowCandidate,
  type FlowCandidateRecord,
  type ToolCallsEvent,
} from '../../../../schemas/index.js';
import { evidenceOf } from '../../src/core/dataflow.js';
import { flowsFromCandidates, recordOfCandidate } from '../../src/core/registry.js';
import { dataFlowStream, FLOWS, stream } from './account-stream.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

describe('flows replay equals the live service', () => {
  it("the replay's choices equal the live service's flow-selections for the same stream", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-replay-'));
    const flowsFile = join(dir, 'flows.json');
    const input = join(dir, 'stream.jsonl');
    writeFileSync(flowsFile, JSON.stringify(FLOWS));
    const { lines, requests } = stream();
    writeFileSync(input, lines.join('\n') + '\n');

    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-${Date.now()}`,
      FLOWS_FILE: flowsFile,
    });
    await createFlowsTopics(env, 1);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      lines.map((l) => ({ key: (JSON.parse(l) as { session_id: string }).session_id, value: l })),
    );
    const got = await consumeUntil(env.PAVER_TOPIC_FLOW_SELECTIONS!, (all) => all.length >= requests);
    const live = new Map(
      got.map((m) => {
        const v = JSON.parse(m.value!.toString()) as { event_id: string; chosen: { id: string }[] };
        return [v.event_id, v.chosen.map((c) => c.id)] as const;
      }),
    );

    const r = await replay({ input, flows: flowsFile, promotion: { mode: 'manual' }, env: {} });
    const offline = new Map(r.choices.map((c) => [c.event_id, c.chosen] as const));
    expect(offline.size).toBe(requests);
    expect(live).toEqual(offline);
    // Not a vacuous equality: flows were chosen, and past outcomes changed the choice for the same request.
    const vague = r.choices.filter((_, i) => i % 4 !== 3).map((c) => c.chosen.join(','));
    expect(vague[0]).not.toBe('');
    expect(new Set(vague).size).toBeGreaterThan(1);
    expect(r.precision).toBeGreaterThan(0.5);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('the live service learns input_map from the stream exactly as the replay and from-candidates --history do', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-replay-df-'));
    const input = join(dir, 'stream.jsonl');
    const runs = 8;
    const lines = dataFlowStream(runs);
    writeFileSync(input, lines.join('\n') + '\n');
    const events: ToolCallsEvent[] = lines.map((l) => toolCallsEventV1.parse(JSON.parse(l)));
    const scope = { tenant: 'default', agent: 'default' };

    // `paver detect` over the whole stream: the candidates the detector would publish at its end.
    const detected = JSON.parse(
      execFileSync(process.execPath, [PAVER_BIN, 'detect', '--input', input], { encoding: 'utf8' }),
    ) as FlowCandidate[];
    const cands = detected.filter((c) => c.occurrence_count >= runs);
    expect(cands.length).toBeGreaterThan(0);
    const records: FlowCandidateRecord[] = cands.map((c) => recordOfCandidate(c, scope, 1));

    // Promotion needs every run: the replay then promotes at the last one, with the same runs behind it.
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-${Date.now()}`,
      FLOWS_PROMOTION: 'auto',
      FLOWS_AUTO_MIN_OCCURRENCES: String(runs),
      FLOWS_SHADOW_TRIALS: '0',
    });
    await createFlowsTopics(env, 1);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      lines.map((l) => ({ key: (JSON.parse(l) as { session_id: string }).session_id, value: l })),
    );
    await waitFor(() => groupCaughtUp(env.FLOWS_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!), 'stream consumed');
    await produce(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      records.map((r) => ({ key: r.dedupe_key, value: JSON.stringify(r) })),
    );
    const got = await consumeUntil(env.PAVER_TOPIC_FLOWS!, (all) => all.length >= records.length);
    const inputsOf = (
      steps: readonly { skill_key?: string; input_map?: Record<string, string>; unbound?: string[] }[],
    ) => steps.map((s) => ({ tool: s.skill_key, input_map: s.input_map, unbound: s.unbound ?? null }));
    const live = new Map(
      got.map((m) => {
        const f = (
          JSON.parse(m.value!.toString()) as {
            flow: { dedupe_key: string; steps: Parameters<typeof inputsOf>[0] };
          }
        ).flow;
        return [f.dedupe_key, inputsOf(f.steps)] as const;
      }),
    );

    const r = await replay({
      input,
      promotion: { mode: 'auto', minOccurrences: runs, shadowTrials: 0 },
      env: {},
    });
    const offline = new Map(
      r.promoted_flows
        .filter((f) => live.has(f.dedupe_key!))
        .map((f) => [f.dedupe_key!, inputsOf(f.steps)] as const),
    );
    const fromHistory = new Map(
      flowsFromCandidates(cands, scope, evidenceOf(events)).map(
        (d, i) => [cands[i]!.dedupe_key, inputsOf(d.steps)] as const,
      ),
    );
    expect(live.size).toBe(records.length);
    expect(live).toEqual(offline);
    expect(live).toEqual(fromHistory);
    // Not vacuous: an argument is bound to an earlier step's output.
    const refs = [...live.values()].flat().flatMap((s) => Object.values(s.input_map ?? {}));
    expect(refs.some((v) => v.startsWith('{{step_1.output'))).toBe(true);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
});
