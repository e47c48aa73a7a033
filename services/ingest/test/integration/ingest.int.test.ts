import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { deadLetterRecordV1, toolCallsEventV1, type ToolCallsEvent } from '../../../../schemas/index.js';
import {
  consumeUntil,
  createTopics,
  groupCaughtUp,
  produce,
  testKafka,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import {
  PAVER_BIN,
  ROOT,
  getJson,
  isReady,
  serviceEnv,
  startProcess,
  type Proc,
} from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { otelRecorder, toJson, toProto } from '../helpers/otel.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

const SECRET = 'pw-4f1c-never-logged';

/** `paver otel` as a process over a file: its stdout JSONL. */
async function paverOtel(file: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [PAVER_BIN, 'otel', '--input', file], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  return { code, stdout, stderr };
}

/** Every record of a topic, read up to the high watermarks as they are now. */
async function readAll(topic: string) {
  const admin = testKafka().admin();
  await admin.connect();
  const offsets = await admin.fetchTopicOffsets(topic);
  await admin.disconnect();
  const total = offsets.reduce((a, o) => a + Number(o.high) - Number(o.low), 0);
  return consumeUntil(topic, (all) => all.length >= total);
}

describe('ingest service (real Kafka, real Redis, spans from the OpenTelemetry JS SDK)', () => {
  it('turns otlp_proto and otlp_json messages into the same tool-calls events as paver otel', async () => {
    // One message per chunk: A's tool spans wait in Redis for its agent span, the redelivery meets a done task.
    const env = serviceEnv({ INGEST_GROUP_ID: `ingest-${Date.now()}`, PAVER_BATCH_CHUNK: '1' });
    env.INGEST_OTLP_TOPIC = `${env.PAVER_TOPIC_TOOL_CALLS}.otlp`;
    await createTopics([
      // One partition: the message order below is the order the service reads.
      { topic: env.INGEST_OTLP_TOPIC, partitions: 1 },
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);

    const rec = otelRecorder();
    const a = rec.agent({
      name: 'Support',
      id: 'agent-support',
      conversationId: 'conv-a',
      tools: [
        { name: 'get_user', callId: 'c1', args: { user_id: 'u1', password: SECRET }, result: { ok: true } },
        { name: 'search', args: { q: 'x' }, result: 'nothing found', error: true },
        { name: 'answer', viaInternalSpan: true },
      ],
    });
    const b = rec.agent({
      name: 'Planner',
      conversationId: 'conv-b',
      tools: [{ name: 'plan' }, { name: 'act' }],
    });
    const c = rec.agent({
      name: 'Outer',
      tools: [{ name: 'delegate', subAgent: { name: 'Inner', tools: [{ name: 'read' }] } }, { name: 'done' }],
    });
    const d = rec.agent({ name: 'Last', conversationId: 'conv-d', tools: [{ name: 'final' }] });
    const http = rec.lone('GET /health', { 'http.request.method': 'GET' });
    const isAgent = (s: (typeof a)[number]) => s.name.startsWith('invoke_agent');
    const key = (spans: typeof a) => spans[0]!.spanContext().traceId;

    await produce(env.INGEST_OTLP_TOPIC, [
      // A's tool spans are exported before its agent span has ended, in another message and encoding.
      { key: key(a), value: toProto(a.filter((s) => !isAgent(s))) },
      { key: key(b), value: toJson(b) },
      { key: key(http), value: toProto(http) },
      { key: key(a), value: toJson(a.filter(isAgent)) },
      { key: 'garbage', value: Buffer.from([0xff, 0xfe, 0x00, 0x01, 0x02]) },
      { key: key(c), value: toProto(c) },
      // A redelivered message: its task is complete, nothing is published twice.
      { key: key(b), value: toJson(b) },
      { key: key(d), value: toProto(d) },
    ]);

    const p = await startProcess([PAVER_BIN, 'run', 'ingest'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'ingest /readyz').catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output()}`);
    });
    // The last message's task on the topic means every message before it was handled (one partition).
    await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) =>
      all.some(
        (m) => m.value?.toString().includes('"task_completed"') && m.value.toString().includes('conv-d'),
      ),
    );
    // A message is counted as read when decoded, its events and spans once they are published and saved, its dead
    // letter once written, all before its offset is committed: wait for the commit, not for the events on the topic.
    await waitFor(
      () => groupCaughtUp(env.INGEST_GROUP_ID!, env.INGEST_OTLP_TOPIC!),
      'all eight messages handled and committed',
    );
    const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));

    const onTopic = await readAll(env.PAVER_TOPIC_TOOL_CALLS!);
    const events = onTopic.map((m) => {
      const e = toolCallsEventV1.parse(JSON.parse(m.value!.toString())) as ToolCallsEvent;
      expect(m.key).toBe(e.session_id);
      return e;
    });

    const dir = mkdtempSync(join(tmpdir(), 'paver-otel-'));
    const file = join(dir, 'export.jsonl');
    writeFileSync(file, [a, b, http, c, d].map((spans) => toJson(spans).toString()).join('\n'));
    const cli = await paverOtel(file);
    expect(cli.code).toBe(0);
    const expected = cli.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as ToolCallsEvent);

    const byId = (x: ToolCallsEvent, y: ToolCallsEvent) => (x.event_id < y.event_id ? -1 : 1);
    expect(events.length).toBe(expected.length);
    expect([...events].sort(byId)).toEqual([...expected].sort(byId));
    expect(expected.filter((e) => e.type === 'tool_call')).toHaveLength(9);
    expect(expected.filter((e) => e.type === 'task_completed')).toHaveLength(5);
    const taskA = events.filter((e) => e.session_id === 'conv-a');
    expect(taskA.map((e) => (e.type === 'tool_call' ? `${e.step}:${e.tool}:${e.status}` : e.type))).toEqual([
      '0:get_user:ok',
      '1:search:error',
      '2:answer:ok',
      'task_completed',
    ]);

    const dead = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 1);
    expect(dead).toHaveLength(1);
    const dl = deadLetterRecordV1.parse(JSON.parse(dead[0]!.value!.toString()));
    expect(dl).toMatchObject({ service: 'ingest', reason: 'undecodable' });
    expect(dead[0]!.headers['paver-dlq-reason']).toBe('undecodable');

    expect(metrics.value('paver_ingest_messages_total', { encoding: 'otlp_proto', outcome: 'decoded' })).toBe(
      4,
    );
    expect(metrics.value('paver_ingest_messages_total', { encoding: 'otlp_json', outcome: 'decoded' })).toBe(
      3,
    );
    expect(metrics.value('paver_ingest_events_total', { type: 'tool_call' })).toBe(9);
    expect(metrics.value('paver_ingest_spans_total', { outcome: 'pending' })).toBe(3);
    expect(metrics.value('paver_ingest_spans_total', { outcome: 'late' })).toBe(2);
    // Every span read has an outcome: the agent spans (B's read twice, Outer and Inner) were counted nowhere.
    expect(metrics.value('paver_ingest_spans_total', { outcome: 'agent' })).toBe(6);
    expect(metrics.value('paver_dead_letters_total', { reason: 'undecodable' })).toBe(1);
    const metricsText = String((await getJson(p.url('/metrics'))).body);
    expect(metricsText).not.toContain(SECRET);
    expect(p.output()).not.toContain(SECRET);

    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('keeps every task whole over partitions when the exporter keys messages by trace id', async () => {
    const env = serviceEnv({
      INGEST_GROUP_ID: `ingest-p-${Date.now()}`,
      KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY: '3',
      // Chunks of two messages: a trace's three messages always straddle a chunk boundary.
      PAVER_BATCH_CHUNK: '2',
    });
    env.INGEST_OTLP_TOPIC = `${env.PAVER_TOPIC_TOOL_CALLS}.otlp`;
    await createTopics([
      { topic: env.INGEST_OTLP_TOPIC, partitions: 3 },
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const rec = otelRecorder();
    const runs = Array.from({ length: 24 }, (_, i) =>
      rec.agent(
        {
          name: `agent-${i % 3}`,
          conversationId: `conv-${i}`,
          tools: Array.from({ length: 2 + (i % 4) }, (_, j) => ({
            name: `tool_${(i + j) % 5}`,
            args: { j },
          })),
        },
        1_700_000_000_000 + i * 1000,
      ),
    );
    // As partition_traces_by_id does: key = trace id. Tool spans and agent span in separate messages.
    const messages = runs.flatMap((spans, i) => {
      const enc = i % 2 ? toJson : toProto;
      const k = spans[0]!.spanContext().traceId;
      const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
      const tools = spans.filter((s) => !s.name.startsWith('invoke_agent'));
      return [
        { key: k, value: enc(tools.slice(0, 1)) },
        { key: k, value: enc(tools.slice(1)) },
        { key: k, value: enc(agent) },
      ];
    });
    await produce(env.INGEST_OTLP_TOPIC, messages);

    const dir = mkdtempSync(join(tmpdir(), 'paver-otel-'));
    const file = join(dir, 'export.jsonl');
    writeFileSync(file, runs.map((spans) => toJson(spans).toString()).join('\n'));
    const cli = await paverOtel(file);
    const expected = cli.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as ToolCallsEvent);
    expect(expected.filter((e) => e.type === 'task_completed')).toHaveLength(24);

    const p = await startProcess([PAVER_BIN, 'run', 'ingest'], env);
    procs.push(p);
    const got = await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => all.length >= expected.length);
    const events = got.map((m) => JSON.parse(m.value!.toString()) as ToolCallsEvent);
    const byId = (x: ToolCallsEvent, y: ToolCallsEvent) => (x.event_id < y.event_id ? -1 : 1);
    expect([...events].sort(byId)).toEqual([...expected].sort(byId));
    // Per session (one partition each), the task's steps arrive in order and task_completed last.
    for (const session of new Set(events.map((e) => e.session_id))) {
      const seq = events.filter((e) => e.session_id === session);
      expect(seq.map((e) => (e.type === 'tool_call' ? e.step : 'end'))).toEqual([
        ...seq.slice(0, -1).map((_, i) => i),
        'end',
      ]);
    }
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('after a crash (SIGKILL) and restart, publishes every event, and a republished one is identical', async () => {
    const env = serviceEnv({ INGEST_GROUP_ID: `ingest-k-${Date.now()}`, PAVER_BATCH_CHUNK: '1' });
    env.INGEST_OTLP_TOPIC = `${env.PAVER_TOPIC_TOOL_CALLS}.otlp`;
    await createTopics([
      { topic: env.INGEST_OTLP_TOPIC, partitions: 1 },
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const rec = otelRecorder();
    const runs = Array.from({ length: 40 }, (_, i) =>
      rec.agent(
        { name: 'A', conversationId: `k-${i}`, tools: [{ name: 'a' }, { name: 'b' }, { name: 'c' }] },
        1_700_000_000_000 + i * 1000,
      ),
    );
    await produce(
      env.INGEST_OTLP_TOPIC,
      runs.flatMap((spans) => {
        const k = spans[0]!.spanContext().traceId;
        const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
        return [
          { key: k, value: toProto(spans.filter((s) => !agent.includes(s))) },
          { key: k, value: toProto(agent) },
        ];
      }),
    );
    const dir = mkdtempSync(join(tmpdir(), 'paver-otel-'));
    const file = join(dir, 'export.jsonl');
    writeFileSync(file, runs.map((spans) => toJson(spans).toString()).join('\n'));
    const expected = (await paverOtel(file)).stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as ToolCallsEvent);
    expect(expected).toHaveLength(160);

    const first = await startProcess([PAVER_BIN, 'run', 'ingest'], env);
    procs.push(first);
    await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => all.length >= 20);
    first.child.kill('SIGKILL');
    await first.exited;
    const second = await startProcess([PAVER_BIN, 'run', 'ingest'], env);
    procs.push(second);
    const unique = new Map<string, ToolCallsEvent>();
    await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => {
      for (const m of all) {
        const e = JSON.parse(m.value!.toString()) as ToolCallsEvent;
        const seen = unique.get(e.event_id);
        if (seen) expect(e).toEqual(seen);
        else unique.set(e.event_id, e);
      }
      return unique.size >= expected.length;
    });
    const byId = (x: ToolCallsEvent, y: ToolCallsEvent) => (x.event_id < y.event_id ? -1 : 1);
    expect([...unique.values()].sort(byId)).toEqual([...expected].sort(byId));
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
  });
});
