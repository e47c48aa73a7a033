import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { catalogKey, nextActionRecordV1, type NextActionRecord } from '../../../../schemas/index.js';
import { consumeUntil, createTopics, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { policyRecord, startAutoseq, toolRecord } from './predict-compare.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

const route = {
  type: 'object',
  properties: { route: { type: 'string' }, text: { type: 'string' } },
  required: ['route', 'text'],
};
let n = 0;
const call = (task: string, extra: Record<string, unknown> = {}) => ({
  key: 's1',
  value: JSON.stringify({
    type: 'tool_call',
    event_id: `ev-${++n}`,
    ts: Date.now(),
    session_id: 's1',
    task_id: task,
    step: n,
    tool: 'triage',
    observation: { route: 'docs', text: 'hi' },
    ...extra,
  }),
});

const start = (env: Record<string, string>) => startAutoseq(env, procs);
const decisions = async (topic: string, count: number) =>
  (await consumeUntil(topic, (all) => all.length >= count))
    .map((m) => nextActionRecordV1.parse(JSON.parse(m.value!.toString())) as NextActionRecord)
    .sort((a, b) => a.step - b.step);

describe('autoseq service (real Kafka, real Redis)', () => {
  it('a catalog change on the topic changes decisions live; bad catalog records are dead-lettered and the old catalog stays', async () => {
    const env = serviceEnv({
      AUTOSEQ_GROUP_ID: `g-${Date.now()}`,
      PAVER_TOPIC_TOOL_CATALOG: `cat-${Date.now()}`,
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_NEXT_ACTIONS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_TOOL_CATALOG!, compacted: true },
    ]);
    // The catalog exists before the service starts: it must be loaded before the first decision.
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [policyRecord(), toolRecord('init_docs', route)]);
    const p = await start(env);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [call('t1')]);
    expect((await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 1))[0]).toMatchObject({
      event_type: 'auto_seq_detected_unique',
      tool: 'init_docs',
      execute: true,
    });

    // Live: a second tool accepting the same payload makes the next decision ambiguous, without a restart.
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [toolRecord('index_docs', route)]);
    await waitFor(
      async () =>
        parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
          'paver_autoseq_catalog_tools',
        ) === 2,
      'catalog update applied',
    );
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [call('t2')]);
    expect((await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 2))[1]).toMatchObject({
      event_type: 'auto_seq_detected_ambiguous',
      candidates: ['index_docs', 'init_docs'],
    });

    // Bad catalog records: not JSON, a schema that does not compile (replacing a good tool), an unknown kind.
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [
      { key: 'x', value: '{not json' },
      toolRecord('index_docs', { type: 'object', properties: { a: { type: 'no-such-type' } } }),
      { key: 'y', value: JSON.stringify({ schema_version: 1, kind: 'macro' }) },
    ]);
    const dlq = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 3);
    expect(dlq.map((m) => m.headers['paver-dlq-reason']).sort()).toEqual([
      'invalid',
      'rejected',
      'undecodable',
    ]);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [call('t3')]);
    expect((await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 3))[2]).toMatchObject({
      event_type: 'auto_seq_detected_ambiguous',
      candidates: ['index_docs', 'init_docs'],
    });

    // Arguments nested too deep to write back: dead-lettered before autoseq reads them (it kept them in Redis,
    // and the stack overflow stopped it on every restart). A result of JSON text that deep is read as text.
    const deep = '['.repeat(10_000) + ']'.repeat(10_000);
    const deepArgs = call('t5', { args: { a: '@' } });
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
      { ...deepArgs, value: deepArgs.value.replace('"@"', deep) },
      call('t6', { observation: deep }),
      call('t6', { observation: deep }),
    ]);
    // (Skipped: a result of text matches no typed schema.)
    expect((await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 5)).slice(3).map((r) => r.event_type)).toEqual([
      'auto_seq_skipped',
      'auto_seq_skipped',
    ]);
    const deadDeep = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 4);
    // The dead-letter topic's partitions are read in no set order: the one from the tool-calls topic.
    expect(
      deadDeep
        .filter((m) => m.headers['paver-source-topic'] === env.PAVER_TOPIC_TOOL_CALLS)
        .map((m) => m.headers['paver-dlq-reason']),
    ).toEqual(['invalid']);

    // A tombstone removes a tool.
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [
      { key: catalogKey('default', 'default', 'tool', 'index_docs'), value: null as unknown as string },
    ]);
    await waitFor(
      async () =>
        parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
          'paver_autoseq_catalog_tools',
        ) === 1,
      'tombstone applied',
    );
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
      call('t4'),
      call('t4', { tool: 'init_docs', origin: 'auto_seq', observation: { done: true } }),
    ]);
    const all = await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 8);
    expect(all.slice(5).map((r) => r.event_type)).toEqual([
      'auto_seq_detected_unique',
      'auto_seq_executed',
      'auto_seq_detected_none',
    ]);
    // The batch counts its effects after it has published and saved them: a decision can be read off the topic
    // before its batch has counted it. Dead letters are counted once written, and those of the catalog's other
    // partitions are not ordered before anything waited for since.
    await waitFor(async () => {
      const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
      return m.value('paver_autoseq_llm_steps_saved_total') === 1 && m.value('paver_dead_letters_total') >= 4;
    }, 'the executed step and the four dead letters counted');
    const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    expect(m.value('paver_autoseq_llm_steps_saved_total')).toBe(1);
    expect(m.value('paver_dead_letters_total')).toBe(4);

    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it("a tombstone on an agent's policy key withdraws the policy live; a record under another key is dead-lettered", async () => {
    const env = serviceEnv({
      AUTOSEQ_GROUP_ID: `g-${Date.now()}`,
      PAVER_TOPIC_TOOL_CATALOG: `cat-${Date.now()}`,
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_NEXT_ACTIONS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_TOOL_CATALOG!, compacted: true },
    ]);
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [policyRecord(), toolRecord('init_docs', route)]);
    const p = await start(env);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [call('p1')]);
    expect((await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 1))[0]).toMatchObject({
      event_type: 'auto_seq_detected_unique',
      execute: true,
    });
    const applied = async () =>
      parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
        'paver_autoseq_catalog_updates_total',
        { outcome: 'applied' },
      );
    const before = await applied();
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [
      // Another tool's key: refused (its tombstone would remove index_docs, not this tool).
      { ...toolRecord('index_docs', route), key: catalogKey('default', 'default', 'tool', 'other') },
      { key: catalogKey('default', 'default', 'policy'), value: null as unknown as string },
    ]);
    const dlq = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 1);
    expect(dlq.map((m) => m.headers['paver-dlq-reason'])).toEqual(['rejected']);
    await waitFor(async () => (await applied()) > before, 'policy tombstone applied');
    // Before: the tombstone was dead-lettered and the policy (executable) stayed in force until a restart.
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [call('p2')]);
    expect((await decisions(env.PAVER_TOPIC_NEXT_ACTIONS!, 2))[1]).toMatchObject({
      event_type: 'auto_seq_skipped',
      reason: 'disabled',
    });
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('refuses an invalid catalog file at start-up with a message naming the tool (exit 78)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-aseq-'));
    const file = join(dir, 'catalog.json');
    writeFileSync(
      file,
      JSON.stringify({ agents: [{ tools: [{ name: 'bad_tool', args_schema: {}, side_effects: 'maybe' }] }] }),
    );
    const p = await startProcess(
      ['bin/paver.js', 'run', 'autoseq'],
      serviceEnv({ AUTOSEQ_CATALOG_FILE: file }),
    );
    procs.push(p);
    expect(await p.exited).toBe(78);
    expect(p.output()).toMatch(/tool 'bad_tool': side_effects/);
  });
});
