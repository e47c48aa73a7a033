import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { consumeUntil, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { FLOWS } from './account-stream.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

describe('flows service: FLOWS_FILE is the source of truth for hand-written flows', () => {
  it('withdraws a flow taken out of the file at the next start, and leaves them alone when no file is set', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-flows-manual-'));
    const file = join(dir, 'flows.json');
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-manual-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-manual-${Date.now()}`,
      FLOWS_FILE: file,
    });
    await createFlowsTopics(env);
    const names = async (p: Proc) => {
      const r = await getJson(p.url('/flows?tenant_id=default&agent_id=default'));
      expect(r.status).toBe(200);
      return (r.body as { name: string; source: string }[]).map((f) => `${f.source}:${f.name}`).sort();
    };
    const run = async (fileFlows: unknown[] | null, expected: string[]) => {
      if (fileFlows) writeFileSync(file, JSON.stringify(fileFlows));
      const p = await startProcess(
        ['bin/paver.js', 'run', 'flows'],
        fileFlows ? env : Object.fromEntries(Object.entries(env).filter(([k]) => k !== 'FLOWS_FILE')),
      );
      procs.push(p);
      await waitFor(() => isReady(p), 'flows /readyz');
      await waitFor(async () => JSON.stringify(await names(p)) === JSON.stringify(expected), 'the registry');
      p.child.kill('SIGTERM');
      expect(await p.exited).toBe(0);
    };
    await run(FLOWS, ['manual:account_close', 'manual:account_review']);
    await run([FLOWS[0]], ['manual:account_review']);
    // The flows topic (compacted: the last record per key wins) says the same to every other instance.
    const topic = env.PAVER_TOPIC_FLOWS!;
    const latest = (all: { key: string | null; value: Buffer | null }[]) => {
      const m = new Map<string, string | null>();
      for (const r of all)
        m.set(
          r.key ?? '',
          r.value ? (JSON.parse(r.value.toString()) as { flow: { name: string } }).flow.name : null,
        );
      return m;
    };
    const all = await consumeUntil(topic, (a) => [...latest(a).values()].includes(null));
    expect([...latest(all).values()].sort()).toEqual(['account_review', null]);
    // No file configured: nothing to compare with, so nothing is withdrawn.
    await run(null, ['manual:account_review']);
  });
});
