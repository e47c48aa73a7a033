import { randomBytes } from 'node:crypto';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { consumeUntil, createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createIngestHandler, createIngestMetrics } from '../../src/adapters/handler.js';
import { RedisTraceStore } from '../../src/adapters/trace-store.js';
import { DEFAULT_MAP_OPTIONS } from '../../src/core/map.js';
import type { OtlpSpan } from '../../src/core/otlp.js';
import { decodeRecorded, deliverTo, otelRecorder } from '../helpers/otel.js';

/*
 * An agent span that never ends (a long-running agent loop, or one that crashed without exporting it) while its
 * tool spans keep coming: each waits in the trace's Redis hash, and every chunk with a span of that trace reads
 * the whole hash back. Without a bound, Redis memory and the work and memory of each chunk grew with the trace.
 */

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  await redis.quit();
});

const decode = decodeRecorded;

/** A span of one trace by number: an agent span, a tool span, or a plain span (a link); `parent` 0 for a root. */
function numbered(traceId: string) {
  const hex = (n: number) => n.toString(16).padStart(16, '0');
  return (n: number, parent: number, kind: 'agent' | 'tool' | 'link'): OtlpSpan => ({
    traceId,
    spanId: hex(n),
    parentSpanId: parent === 0 ? null : hex(parent),
    name: kind,
    startNs: 1_700_000_000_000_000_000n + BigInt(n),
    endNs: 1_700_000_000_000_000_000n + BigInt(n) + 1n,
    status: 'unset',
    attributes:
      kind === 'agent'
        ? { 'gen_ai.operation.name': 'invoke_agent' }
        : kind === 'tool'
          ? { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': `t${n}` }
          : {},
    resource: {},
  });
}

async function ingestInto(opts: { maxPendingSpans?: number; maxPendingBytes?: number }) {
  const topic = unique('tool-calls');
  await createTopics([{ topic, partitions: 1 }]);
  await sink.connect();
  const prefix = unique('ingest');
  const registry = new Registry();
  const handle = createIngestHandler({
    store: new RedisTraceStore(redis, prefix, 3_600_000),
    sink,
    topic,
    opts: DEFAULT_MAP_OPTIONS,
    metrics: createIngestMetrics(registry),
    ...opts,
  });
  const outcomes = async () => {
    const values = (await registry.getSingleMetric('paver_ingest_spans_total')!.get()).values;
    return Object.fromEntries(values.filter((v) => v.value > 0).map((v) => [v.labels.outcome, v.value]));
  };
  return { topic, prefix, registry, deliver: deliverTo(handle), outcomes };
}

describe('ingest: spans waiting for an agent span are bounded per trace (real Redis and Kafka)', () => {
  it('keeps at most maxPendingSpans of a trace and counts the rest as dropped', async () => {
    const spans = otelRecorder().agent({
      name: 'A',
      tools: Array.from({ length: 30 }, (_, i) => ({ name: `t${i}` })),
    });
    const tools = decode(spans.filter((s) => s.name.startsWith('execute_tool')));
    expect(tools).toHaveLength(30);
    const traceId = tools[0]!.traceId;

    const { prefix, registry, deliver } = await ingestInto({ maxPendingSpans: 8 });
    // The agent span never comes: three messages of ten tool spans each.
    for (let m = 0; m < 3; m++) await deliver(tools.slice(m * 10, m * 10 + 10));
    const fields = await redis.hkeys(`${prefix}:ingest:trace:${traceId}`);
    // Before, all 30 waited (and a trace that never ends grew for good).
    expect(fields.filter((f) => f.startsWith('s:'))).toHaveLength(8);
    const metrics = await registry.getSingleMetricAsString('paver_ingest_spans_total');
    expect(metrics).toContain('outcome="pending"} 8');
    expect(metrics).toContain('outcome="dropped"} 22');
  });

  it('gives a redelivered span no room again: a new span of the trace is kept, and its task published whole', async () => {
    const spans = otelRecorder().agent({ name: 'A', tools: [{ name: 'a' }, { name: 'b' }, { name: 'c' }] });
    const tools = decode(spans.filter((s) => s.name.startsWith('execute_tool')));
    const agent = decode(spans.filter((s) => s.name.startsWith('invoke_agent')));
    const topic = unique('tool-calls');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const registry = new Registry();
    const handle = createIngestHandler({
      store: new RedisTraceStore(redis, unique('ingest'), 3_600_000),
      sink,
      topic,
      opts: DEFAULT_MAP_OPTIONS,
      metrics: createIngestMetrics(registry),
      // Exactly the task's tool spans.
      maxPendingSpans: 3,
    });
    const ctx = { heartbeat: async () => undefined, isRunning: () => true };
    const record = (offset: number, s: typeof tools) => ({
      topic: 'otlp',
      partition: 0,
      offset: String(offset),
      key: null,
      timestamp: '0',
      value: { spans: s },
    });
    const first = record(0, tools.slice(0, 2));
    await handle([first], ctx);
    // At-least-once: the first message, handled but not committed (a crash, a rebalance), is read again with the next.
    await handle([first, record(1, tools.slice(2))], ctx);
    await handle([record(2, agent)], ctx);

    const got = await consumeUntil(topic, (all) =>
      all.some((m) => m.value!.toString().includes('task_completed')),
    );
    const events = got.map((m) => JSON.parse(m.value!.toString()) as { type: string; tool?: string });
    // Before: the redelivered spans took the room left, `c` was dropped and the task published without it.
    expect(events.map((e) => e.tool ?? e.type)).toEqual(['a', 'b', 'c', 'task_completed']);
    expect(await registry.getSingleMetricAsString('paver_ingest_spans_total')).not.toContain(
      'outcome="dropped"',
    );
  });

  it('keeps at most maxPendingBytes of a trace, counts a span that does not fit as dropped, and lets a smaller one in', async () => {
    // Records of about 1.7 KB each, one of about 9.2 KB (under the payload limit, over the trace's room), and small ones.
    const result = (n: number) => 'r'.repeat(n);
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [
        ...['t0', 't1', 't2'].map((name) => ({ name, result: result(1500) })),
        { name: 'big', result: result(9000) },
        ...['u0', 'u1', 'u2'].map((name) => ({ name })),
        ...['t3', 't4'].map((name) => ({ name, result: result(1500) })),
      ],
    });
    const tools = decode(spans.filter((s) => s.name.startsWith('execute_tool')));
    expect(tools.map((t) => t.attributes['gen_ai.tool.name'])).toEqual([
      't0',
      't1',
      't2',
      'big',
      'u0',
      'u1',
      'u2',
      't3',
      't4',
    ]);
    const traceId = tools[0]!.traceId;
    const maxPendingBytes = 6 * 1024;
    const { prefix, registry, deliver } = await ingestInto({ maxPendingBytes });
    // The agent span never comes: one span per message, so the bound holds across messages too.
    for (const t of tools) await deliver([t]);
    const hash = await redis.hgetall(`${prefix}:ingest:trace:${traceId}`);
    const waiting = Object.entries(hash).filter(([f]) => f.startsWith('s:'));
    // Before, all nine waited (about 19 KB): only the count bounded a trace.
    const bytes = waiting.reduce((n, [, v]) => n + Buffer.byteLength(v), 0);
    expect(bytes).toBeLessThanOrEqual(maxPendingBytes);
    const names = waiting.map(([, v]) => (JSON.parse(v) as { tool: string }).tool).sort();
    expect(names).toEqual(['t0', 't1', 't2', 'u0', 'u1', 'u2']);
    const metrics = await registry.getSingleMetricAsString('paver_ingest_spans_total');
    expect(metrics).toContain('outcome="pending"} 6');
    expect(metrics).toContain('outcome="dropped"} 3');
  });

  it('drops a tool span below a link that found no room: it could never reach its agent span', async () => {
    const traceId = randomBytes(16).toString('hex');
    const span = numbered(traceId);
    const { topic, prefix, deliver, outcomes } = await ingestInto({ maxPendingSpans: 2 });
    // Agent 1 (not exported yet) ← tool 10; agent 1 ← link 2 ← link 3 ← tool 11. Exported child first, the agent last.
    await deliver([span(10, 1, 'tool'), span(11, 3, 'tool'), span(3, 2, 'link'), span(2, 1, 'link')]);
    // Room for two: tool 10 and link 2; link 3 found none, so tool 11 below it could never be published.
    // Before: { pending: 2, other: 2 }: tool 11 took the room first, waited below links never stored, and expired.
    expect(await outcomes()).toEqual({ pending: 1, dropped: 1, other: 2 });
    const key = `${prefix}:ingest:trace:${traceId}`;
    expect((await redis.hkeys(key)).filter((f) => f.startsWith('s:')).sort()).toEqual([
      `s:${span(2, 1, 'link').spanId}`,
      `s:${span(10, 1, 'tool').spanId}`,
    ]);
    await deliver([span(1, 0, 'agent')]);
    const got = await consumeUntil(topic, (all) =>
      all.some((m) => m.value!.toString().includes('task_completed')),
    );
    const events = got.map((m) => JSON.parse(m.value!.toString()) as { type: string; tool?: string });
    expect(events.map((e) => e.tool ?? e.type)).toEqual(['t10', 'task_completed']);
    expect(await outcomes()).toEqual({ pending: 1, dropped: 1, other: 2, agent: 1 });
    // Nothing is left waiting for good.
    expect((await redis.hkeys(key)).filter((f) => f.startsWith('s:'))).toEqual([]);
  });

  it('lets go of a waiting tool span once a link of its path comes and finds no room, for a span that can use it', async () => {
    const traceId = randomBytes(16).toString('hex');
    const span = numbered(traceId);
    const { topic, prefix, deliver, outcomes } = await ingestInto({ maxPendingSpans: 2 });
    const key = `${prefix}:ingest:trace:${traceId}`;
    const waiting = async () =>
      (await redis.hkeys(key))
        .filter((f) => f.startsWith('s:'))
        .map((f) => f.slice(2))
        .sort();
    // Agent 1 (not exported yet) ← link 2 ← link 3 ← tool 11: the tool span and link 3 wait, the trace is full.
    await deliver([span(11, 3, 'tool'), span(3, 2, 'link')]);
    expect(await waiting()).toEqual([span(3, 2, 'link').spanId, span(11, 3, 'tool').spanId]);
    // Link 2 finds no room: tool 11 can never reach its agent span, and leaves the hash.
    await deliver([span(2, 1, 'link')]);
    expect(await waiting()).toEqual([span(3, 2, 'link').spanId]);
    // A tool span right below the agent span then has room. Before: tool 11 held its place until it expired, and
    // this one was dropped.
    await deliver([span(12, 1, 'tool')]);
    await deliver([span(1, 0, 'agent')]);
    const got = await consumeUntil(topic, (all) =>
      all.some((m) => m.value!.toString().includes('task_completed')),
    );
    const events = got.map((m) => JSON.parse(m.value!.toString()) as { type: string; tool?: string });
    expect(events.map((e) => e.tool ?? e.type)).toEqual(['t12', 'task_completed']);
    expect(await outcomes()).toEqual({ pending: 2, other: 2, agent: 1 });
    expect(await waiting()).toEqual([]);
  });

  it('takes a chain of 5,000 links with 5,000 tool spans below it in one request, and publishes them all', async () => {
    const traceId = randomBytes(16).toString('hex');
    const span = numbered(traceId);
    const { topic, prefix, deliver, outcomes } = await ingestInto({});
    // Agent 1 ← link 2 ← … ← link 5001 ← tool spans 10001..15000: 10,000 spans, the default bound on both.
    const links = Array.from({ length: 5000 }, (_, i) => span(i + 2, i + 1, 'link'));
    const tools = Array.from({ length: 5000 }, (_, j) => span(10_001 + j, 5001, 'tool'));
    await deliver([...tools, ...links.reverse()]);
    expect(await outcomes()).toEqual({ pending: 5000, other: 5000 });
    const key = `${prefix}:ingest:trace:${traceId}`;
    expect((await redis.hkeys(key)).filter((f) => f.startsWith('s:'))).toHaveLength(10_000);
    await deliver([span(1, 0, 'agent')]);
    const got = await consumeUntil(topic, (all) => all.length >= 5001);
    const types = got.map((m) => (JSON.parse(m.value!.toString()) as { type: string }).type);
    expect(types.filter((t) => t === 'tool_call')).toHaveLength(5000);
    expect(types.at(-1)).toBe('task_completed');
    expect(await outcomes()).toEqual({ pending: 5000, other: 5000, agent: 1 });
    expect((await redis.hkeys(key)).filter((f) => f.startsWith('s:'))).toEqual([]);
  });
});
