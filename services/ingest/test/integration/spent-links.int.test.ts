import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { OtlpSpan } from '../../src/core/otlp.js';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createIngestHandler, createIngestMetrics } from '../../src/adapters/handler.js';
import { RedisTraceStore } from '../../src/adapters/trace-store.js';
import { DEFAULT_MAP_OPTIONS } from '../../src/core/map.js';
import { decodeRecorded, deliverTo, otelRecorder } from '../helpers/otel.js';

/*
 * One long trace (a conversation, a worker loop) holding task after task, each tool span under a non-GenAI span
 * and exported before its agent span. The non-GenAI span is kept in the trace's hash while the tool span waits;
 * it used to stay there after the task was published: every task left one behind (the hash's TTL is refreshed
 * by every change of the trace, so they never left), and they counted against INGEST_MAX_PENDING_SPANS, so once
 * that many had piled up every later tool span was dropped and its task published without its tool calls.
 */

const redis = testRedis();

/** A handler over real Redis whose published events are collected (the Kafka side is not under test here). */
function recordingHandler(maxPendingSpans?: number) {
  const published: { type: string; task_id: string; tool?: string }[] = [];
  const sink = {
    send: async (_topic: string, _contract: string, records: { value: unknown }[]) => {
      for (const r of records) published.push(r.value as (typeof published)[number]);
    },
  } as unknown as Sink;
  const prefix = unique('ingest');
  const registry = new Registry();
  const handle = createIngestHandler({
    store: new RedisTraceStore(redis, prefix, 3_600_000),
    sink,
    topic: 'tool-calls',
    opts: DEFAULT_MAP_OPTIONS,
    metrics: createIngestMetrics(registry),
    ...(maxPendingSpans === undefined ? {} : { maxPendingSpans }),
  });
  const ctx = { heartbeat: async () => undefined, isRunning: () => true };
  /** Messages handled as one chunk, at offsets 100, 101, … (after deliver's). */
  const chunk = (...messages: OtlpSpan[][]) =>
    handle(
      messages.map((spans, i) => ({
        topic: 'otlp',
        partition: 0,
        offset: String(100 + i),
        key: null,
        timestamp: '0',
        value: { spans },
      })),
      ctx,
    );
  return { published, prefix, registry, deliver: deliverTo(handle), chunk };
}
afterAll(async () => {
  await redis.quit();
});

describe('ingest: spans between a tool and its agent leave once the task is published (real Redis)', () => {
  it('keeps publishing every tool call of a long trace, and its hash does not grow with its tasks', async () => {
    const { published, prefix, deliver } = recordingHandler(4);

    const rec = otelRecorder();
    const traceId = 'ab'.repeat(16);
    const tasks = 10;
    let lastAgent = '';
    for (let k = 0; k < tasks; k++) {
      const spans = decodeRecorded(
        rec.agent(
          { name: 'A', tools: [{ name: `t${k}`, viaInternalSpan: true }] },
          1_700_000_000_000 + k * 1_000,
        ),
      ).map((s) => ({ ...s, traceId }));
      const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
      expect(agent).toHaveLength(1);
      lastAgent = agent[0]!.spanId;
      // The tool span and the span above it first; the agent span in a later message.
      await deliver(spans.filter((s) => !agent.includes(s)));
      await deliver(agent);
    }

    const calls = published.filter((e) => e.type === 'tool_call').map((e) => e.tool);
    // Before: t0..t2 only; from the fourth task on, the leftover spans filled the trace's room.
    expect(calls).toEqual(Array.from({ length: tasks }, (_, k) => `t${k}`));
    const fields = await redis.hkeys(`${prefix}:ingest:trace:${traceId}`);
    expect(fields.filter((f) => f.startsWith('s:'))).toEqual([]);
    // Done marks are bounded as waiting spans are (the latest kept): before, two per task, for good.
    const marks = fields.filter((f) => f.startsWith('d:'));
    expect(marks).toHaveLength(4);
    expect(marks).toContain(`d:${lastAgent}`);
  });

  it('still counts a tool span that comes after its task as late, also under a span between', async () => {
    const { published, prefix, registry, deliver } = recordingHandler();
    const spans = decodeRecorded(
      otelRecorder().agent({ name: 'A', tools: [{ name: 'one', viaInternalSpan: true }, { name: 'two' }] }),
    );
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    const one = spans.filter((s) => s.name === 'execute_tool one');
    const two = spans.filter((s) => s.name === 'execute_tool two');
    const between = spans.filter((s) => s.name === 'framework step');
    await deliver([...one, ...between, ...two]);
    await deliver(agent);
    expect(published.filter((e) => e.type === 'tool_call').map((e) => e.tool)).toEqual(['one', 'two']);
    // The tool span under the span between, delivered again: late, not pending (its task is published).
    await deliver(one);
    const metrics = await registry.getSingleMetricAsString('paver_ingest_spans_total');
    expect(metrics).toContain('outcome="late"} 1');
    // The two of the first message only.
    expect(metrics).toContain('outcome="pending"} 2');
    const fields = await redis.hkeys(`${prefix}:ingest:trace:${agent[0]!.traceId}`);
    expect(fields.filter((f) => f.startsWith('s:'))).toEqual([]);
  });

  it('counts as late a tool span below a span that came in the same message as its agent span', async () => {
    // A tool run by another process (a remote tool service) below the agent's own span for the call: the agent's
    // process exports that span and the agent span together, the tool's process its span later.
    const { published, prefix, registry, deliver } = recordingHandler();
    const spans = decodeRecorded(
      otelRecorder().agent({
        name: 'A',
        tools: [{ name: 'remote', viaInternalSpan: true }, { name: 'local' }],
      }),
    );
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    const remote = spans.filter((s) => s.name === 'execute_tool remote');
    const local = spans.filter((s) => s.name === 'execute_tool local');
    const between = spans.filter((s) => s.name === 'framework step');
    await deliver([...local, ...between, ...agent]);
    expect(published.filter((e) => e.type === 'tool_call').map((e) => e.tool)).toEqual(['local']);
    await deliver(remote);
    const metrics = await registry.getSingleMetricAsString('paver_ingest_spans_total');
    // Before: pending, kept in the trace's hash until it expired, as if its task could still be published.
    expect(metrics).toContain('outcome="late"} 1');
    expect(metrics).not.toContain('outcome="pending"');
    const fields = await redis.hkeys(`${prefix}:ingest:trace:${agent[0]!.traceId}`);
    expect(fields.filter((f) => f.startsWith('s:'))).toEqual([]);
  });

  it('keeps at most INGEST_MAX_PENDING_SPANS marks when one message brings an agent span with more spans below it', async () => {
    const { published, prefix, deliver } = recordingHandler(4);
    const spans = decodeRecorded(
      otelRecorder().agent({
        name: 'A',
        tools: Array.from({ length: 6 }, (_, i) => ({ name: `t${i}`, viaInternalSpan: true })),
      }),
    );
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    // The whole task in one message: the agent span and six spans between it and its tool spans.
    await deliver(spans);
    expect(published.filter((e) => e.type === 'tool_call')).toHaveLength(6);
    const marks = (await redis.hkeys(`${prefix}:ingest:trace:${agent[0]!.traceId}`)).filter((f) =>
      f.startsWith('d:'),
    );
    // Before: seven marks (the agent's and one per span between), over the bound of four.
    expect(marks.length).toBeLessThanOrEqual(4);
    // The agent's own mark is the one a redelivery of the task is judged by: it is kept.
    expect(marks).toContain(`d:${agent[0]!.spanId}`);
  });

  it('keeps no span of a long trace that no waiting tool span needs: its tool calls keep their room', async () => {
    const { published, prefix, deliver } = recordingHandler(4);

    // A worker loop: its root span ends (and is exported) only when the loop stops; below it, task after task,
    // and a span of other work (a database query) beside each task.
    const rec = otelRecorder();
    const traceId = 'cd'.repeat(16);
    const root = 'ef'.repeat(8);
    const tasks = 10;
    let agentBefore: OtlpSpan[] = [];
    for (let k = 0; k < tasks; k++) {
      const spans = decodeRecorded(
        rec.agent(
          { name: 'A', tools: [{ name: `a${k}` }, { name: `b${k}` }, { name: `c${k}` }] },
          1_700_000_000_000 + k * 1_000,
        ),
      ).map((s) => ({ ...s, traceId }));
      const agent = spans
        .filter((s) => s.name.startsWith('invoke_agent'))
        .map((s) => ({ ...s, parentSpanId: root }));
      const query: OtlpSpan = {
        ...agent[0]!,
        spanId: (k + 1).toString(16).padStart(16, '0'),
        name: 'db query',
        attributes: {},
      };
      // The SDK's batch: the agent span of the task before, the query, and this task's tool spans.
      await deliver([...agentBefore, query, ...spans.filter((s) => s.name.startsWith('execute_tool'))]);
      agentBefore = agent;
    }
    await deliver(agentBefore);

    const calls = published.filter((e) => e.type === 'tool_call').map((e) => e.tool);
    // Before: each query stayed in the trace's hash while the next task's tool spans waited, until they filled its
    // room; from the second task on, tool spans were dropped and tasks published without them.
    expect(calls).toEqual(Array.from({ length: tasks }, (_, k) => [`a${k}`, `b${k}`, `c${k}`]).flat());
    const fields = await redis.hkeys(`${prefix}:ingest:trace:${traceId}`);
    expect(fields.filter((f) => f.startsWith('s:'))).toEqual([]);
  });
  it('writes one mark for a task read whole in one message: its agent span, none for the spans between', async () => {
    // The usual case: the agent's process exports the whole task together (each tool span below a framework span).
    const { published, prefix, deliver } = recordingHandler();
    const spans = decodeRecorded(
      otelRecorder().agent({
        name: 'A',
        tools: [
          { name: 'a', viaInternalSpan: true },
          { name: 'b', viaInternalSpan: true },
          { name: 'c', viaInternalSpan: true },
          { name: 'd' },
        ],
      }),
    );
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    await deliver(spans);
    expect(published.filter((e) => e.type === 'tool_call').map((e) => e.tool)).toEqual(['a', 'b', 'c', 'd']);
    const marks = (await redis.hkeys(`${prefix}:ingest:trace:${agent[0]!.traceId}`)).filter((f) =>
      f.startsWith('d:'),
    );
    // Before: four, the agent's and one per framework span, each kept INGEST_PENDING_TTL_MS and taking the room of
    // agents' marks in a long trace. A framework span whose tool span came with it serves no later span: a
    // redelivery of that message brings it again.
    expect(marks).toEqual([`d:${agent[0]!.spanId}`]);
    // The whole message again: every tool span late, nothing published twice.
    await deliver(spans);
    expect(published.filter((e) => e.type === 'tool_call')).toHaveLength(4);
  });

  it.each(['two chunks', 'one chunk'] as const)(
    'still counts as late a redelivered tool span whose span above it came later, with the agent span (%s)',
    async (cut) => {
      const { published, registry, deliver, chunk } = recordingHandler();
      const spans = decodeRecorded(
        otelRecorder().agent({ name: 'A', tools: [{ name: 'a', viaInternalSpan: true }, { name: 'b' }] }),
      );
      const a = spans.filter((s) => s.name === 'execute_tool a');
      // The tool span alone first (its span above not exported yet), then the rest of the task.
      if (cut === 'two chunks') {
        await deliver(a);
        await deliver(spans.filter((s) => !a.includes(s)));
      } else
        await chunk(
          a,
          spans.filter((s) => !a.includes(s)),
        );
      expect(published.filter((e) => e.type === 'tool_call').map((e) => e.tool)).toEqual(['a', 'b']);
      // The first message again (at-least-once): the span above `a` came in another message, so it is marked.
      await deliver(a);
      const metrics = await registry.getSingleMetricAsString('paver_ingest_spans_total');
      expect(metrics).toContain('outcome="late"} 1');
    },
  );
});
