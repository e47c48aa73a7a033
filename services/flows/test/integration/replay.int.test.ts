import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { replay } from '../../../../cli/flows-replay.js';
import { consumeUntil, createTopics, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { FLOWS, stream } from './account-stream.js';

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
    await createTopics([
      // One partition: the live service sees the stream in file order, as the replay does.
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_FLOW_SELECTIONS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_FLOWS!, compacted: true },
    ]);
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
});
