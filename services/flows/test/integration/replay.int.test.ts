import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { replay } from '../../../../cli/flows-replay.js';
import { consumeUntil, createTopics, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

/**
 * Two flows share the word of a vague request; the one the words favour ('review') is not what agents do for
 * it ('close'). Past outcomes must move the choice after the first runs, so the choices change along the
 * stream, and the live service has to learn exactly as the replay does to give the same ones.
 */
const FLOWS = [
  {
    name: 'account_review',
    description: 'Help review an account: look it up, audit it, report.',
    condition: 'The user wants help reviewing their account.',
    steps: [
      { name: 'Lookup', skill_key: 'acct_lookup' },
      { name: 'Audit', skill_key: 'acct_audit' },
      { name: 'Report', skill_key: 'acct_report' },
    ],
  },
  {
    name: 'account_close',
    description: 'Close an account: look it up, freeze it, close it.',
    condition: 'The user wants their account closed.',
    steps: [
      { name: 'Lookup', skill_key: 'acct_lookup' },
      { name: 'Freeze', skill_key: 'acct_freeze' },
      { name: 'Close', skill_key: 'acct_close' },
    ],
  },
];

function stream(): { lines: string[]; requests: number } {
  const lines: string[] = [];
  let ts = 1_700_000_000_000;
  let requests = 0;
  const runs: [string, string[]][] = [];
  for (let i = 0; i < 14; i++) {
    if (i % 4 === 3)
      runs.push([
        'I need a written audit report of my account spending',
        ['acct_lookup', 'acct_audit', 'acct_report'],
      ]);
    else runs.push(['please help with my account', ['acct_lookup', 'acct_freeze', 'acct_close', 'notify']]);
  }
  runs.forEach(([text, tools], i) => {
    const s = `run-${i}`;
    const base = { session_id: s, task_id: s };
    lines.push(JSON.stringify({ type: 'user_message', event_id: `${s}:user`, ...base, ts: ts++, text }));
    requests++;
    tools.forEach((tool, step) =>
      lines.push(
        JSON.stringify({
          type: 'tool_call',
          event_id: `${s}:${step}`,
          ...base,
          step,
          tool,
          args: {},
          ts: ts++,
        }),
      ),
    );
    lines.push(JSON.stringify({ type: 'task_completed', event_id: `${s}:done`, ...base, ts: ts++ }));
  });
  return { lines, requests };
}

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
