import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { consumeUntil, produce, testKafka, waitFor } from '../../../../test/helpers/kafka.js';
import { startLlmDouble } from '../../../../test/helpers/llm-double.js';
import {
  isReady,
  ROOT,
  serviceEnv,
  startProcess,
  stopPromptly,
  type Proc,
} from '../../../../test/helpers/process.js';
import { FLOWS } from './account-stream.js';
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

describe('flows service: a stop while start-up waits for the flow registry', () => {
  it('ends the start-up there: the hand-written flows are not published to the flows topic', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-flows-stop-wait-'));
    const flowsFile = join(dir, 'flows.json');
    writeFileSync(flowsFile, JSON.stringify(FLOWS));
    const env = serviceEnv({
      FLOWS_FILE: flowsFile,
      FLOWS_GROUP_ID: `fl-wait-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-wait-${Date.now()}`,
      // One record batch per fetch: reading the flows topic takes many fetches, and a while.
      KAFKA_MAX_BYTES_PER_PARTITION: '1024',
      // Longer than the test: only the stop ends the wait.
      FLOWS_REGISTRY_WAIT_MS: '600000',
      PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
    });
    await createFlowsTopics(env);
    const topic = env.PAVER_TOPIC_FLOWS!;
    // Tombstones of flows no one has (the registry removes nothing), each alone in its request and so in its
    // record batch, over KAFKA_MAX_BYTES_PER_PARTITION with its key.
    const PAD = 8000;
    const pad = testKafka().producer();
    await pad.connect();
    try {
      for (let i = 0; i < PAD; i += 50)
        await Promise.all(
          Array.from({ length: Math.min(50, PAD - i) }, (_, j) =>
            pad.send({
              topic,
              acks: -1,
              messages: [{ key: `gone-${i + j}-${'x'.repeat(1100)}`, value: null }],
            }),
          ),
        );
    } finally {
      await pad.disconnect();
    }

    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    // The registry's reader has begun (it commits after each chunk), and start-up waits for it to end.
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await waitFor(
        async () => {
          const { groups } = await admin.listGroups();
          for (const g of groups.filter((x) => x.groupId.startsWith(`${env.FLOWS_GROUP_ID!}-table-`))) {
            const [offsets] = await admin.fetchOffsets({ groupId: g.groupId, topics: [topic] });
            if (offsets?.partitions.some((o) => BigInt(o.offset) > 0n)) return true;
          }
          return false;
        },
        'the flow registry read under way',
        120_000,
      );
    } finally {
      await admin.disconnect();
    }
    expect(await stopPromptly(p), p.output().slice(-3000)).toBe(0);
    // The stop came during the wait, not after it.
    expect(p.output()).not.toContain('flow registry loaded');

    // Read to the end: one marker per partition, written after the process exited.
    const ends = [0, 1, 2].map((partition) => ({ key: `end-${partition}`, value: 'end', partition }));
    await produce(topic, ends);
    const all = await consumeUntil(topic, (rs) => ends.every((e) => rs.some((r) => r.key === e.key)));
    // Before: every hand-written flow, published after the stop had begun.
    expect(all.filter((r) => r.value !== null && !r.key?.startsWith('end-')).map((r) => r.key)).toEqual([]);
    expect(p.output()).not.toContain('hand-written flows registered');
  });
});
