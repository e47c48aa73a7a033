import { afterAll, describe, expect, it } from 'vitest';
import { waitFor } from '../../../../test/helpers/kafka.js';
import { startLlmDouble } from '../../../../test/helpers/llm-double.js';
import { isReady, ROOT, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
// fetch sends a string body as text/plain, which a JSON route refuses (415).
const JSON_TYPE = { 'content-type': 'application/json' };
const closers: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  for (const c of closers) await c();
});

describe('flows service: the model stage against malformed, slow and failing answers', () => {
  it('falls back to the top-ranked candidate, reports unresolved ids, and never waits past the budget', async () => {
    const llm = await startLlmDouble((body) => {
      const user = body.messages.find((m) => m.role === 'user')?.content ?? '';
      const ids = [...user.matchAll(/<flow id="([^"]+)"><name>([^<]+)<\/name>/g)].map((m) => ({
        id: m[1]!,
        name: m[2]!,
      }));
      const pay = ids.find((f) => f.name === 'pay_bill')?.id;
      const bal = ids.find((f) => f.name === 'check_balance')?.id;
      if (user.includes('slowly')) return { content: `["${pay}"]`, delayMs: 3000 };
      if (user.includes('garbled')) return { content: 'I would go with the bill one, probably.' };
      if (user.includes('broken')) return { raw: '{"choices": "nope"' };
      if (user.includes('failing')) return { status: 500 };
      if (user.includes('ghost')) return { content: `["00000000-0000-5000-8000-000000000000", "${bal}"]` };
      return { content: `Both: ["${bal}", "${pay}"]` };
    });
    closers.push(llm.close);
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-${Date.now()}`,
      FLOWS_FILE: `${ROOT}examples/flows.yaml`,
      FLOWS_CHAT_URL: llm.url,
      FLOWS_SELECT_BUDGET_MS: '500',
    });
    await createFlowsTopics(env);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');
    const sel = async (query: string) => {
      const res = await fetch(p.url('/flows/select'), {
        method: 'POST',
        headers: JSON_TYPE,
        body: JSON.stringify({ query }),
      });
      expect(res.status).toBe(200);
      return (await res.json()) as {
        path: string;
        chosen: { name: string }[];
        unresolved_ids: string[];
        candidates: { name: string }[];
      };
    };
    const q = 'check my balance and then pay my bill';
    expect(await sel(q)).toMatchObject({
      path: 'model',
      chosen: [{ name: 'check_balance' }, { name: 'pay_bill' }],
    });
    for (const marker of ['garbled', 'broken', 'failing']) {
      const r = await sel(`${q} (${marker})`);
      expect(r.path, marker).toBe('fallback');
      expect(r.chosen).toEqual([{ id: expect.any(String), name: r.candidates[0]!.name }]);
    }
    // The double would answer pay_bill after 3 s; the 500 ms budget aborts the call and the fallback decides.
    const slow = await sel(`${q} slowly`);
    expect(slow).toMatchObject({ path: 'fallback', chosen: [{ name: slow.candidates[0]!.name }] });
    expect(await sel(`${q} ghost`)).toMatchObject({
      path: 'model',
      chosen: [{ name: 'check_balance' }],
      unresolved_ids: ['00000000-0000-5000-8000-000000000000'],
    });
    expect(await sel('refund my order please')).toMatchObject({
      path: 'fast_path',
      chosen: [{ name: 'refund_order' }],
    });
    const bad = await fetch(p.url('/flows/select'), {
      method: 'POST',
      headers: JSON_TYPE,
      body: JSON.stringify({ q: 1 }),
    });
    expect(bad.status).toBe(400);
    expect(p.output()).not.toMatch(/I would go with|choices/);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
});
