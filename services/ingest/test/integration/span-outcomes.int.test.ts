import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { consumeUntil, createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import {
  createIngestHandler,
  createIngestMetrics,
  otlpParser,
  type OtlpMessage,
} from '../../src/adapters/handler.js';
import { RedisTraceStore } from '../../src/adapters/trace-store.js';
import { DEFAULT_MAP_OPTIONS } from '../../src/core/map.js';
import { DEFAULT_DECODE_LIMITS, type OtlpSpan } from '../../src/core/otlp.js';
import { decodeRecorded, otelRecorder, toJson } from '../helpers/otel.js';

/*
 * paver_ingest_spans_total counts spans read, one outcome each: the outcomes add up to the spans read. A tool span
 * that waited was counted as pending when read and again as tool_call when its task was published; a span read
 * twice in one chunk (a message redelivered with the next) was counted once.
 */

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  await redis.quit();
});

/** `failSends`: that many sends fail first (the broker unreachable), as a chunk whose publication fails. */
async function setup(failSends = 0) {
  const topic = unique('tool-calls');
  await createTopics([{ topic, partitions: 1 }]);
  await sink.connect();
  const registry = new Registry();
  let failing = failSends;
  const handle = createIngestHandler({
    store: new RedisTraceStore(redis, unique('ingest'), 3_600_000),
    sink: {
      ...sink,
      send: (...args: Parameters<typeof sink.send>) => {
        if (failing-- > 0) return Promise.reject(new Error('broker unreachable'));
        return sink.send(...args);
      },
    },
    topic,
    opts: DEFAULT_MAP_OPTIONS,
    metrics: createIngestMetrics(registry),
  });
  let offset = 0;
  const ctx = { heartbeat: async () => undefined, isRunning: () => true };
  const record = (value: OtlpMessage) => ({
    topic: 'otlp',
    partition: 0,
    offset: String(offset++),
    key: null,
    timestamp: '0',
    value,
  });
  const outcomes = async () => {
    const values = (await registry.getSingleMetric('paver_ingest_spans_total')!.get()).values;
    return Object.fromEntries(values.filter((v) => v.value > 0).map((v) => [v.labels.outcome, v.value]));
  };
  const published = async (tasks: number) =>
    (
      await consumeUntil(
        topic,
        (all) => all.filter((m) => m.value!.toString().includes('"task_completed"')).length >= tasks,
      )
    ).map((m) => (JSON.parse(m.value!.toString()) as { type: string }).type);
  return {
    handle: (...batch: OtlpSpan[][]) =>
      handle(
        batch.map((spans) => record({ spans })),
        ctx,
      ),
    /** Messages as the runner hands them over: raw bytes through the service's parser. */
    handleRaw: (...batch: Buffer[]) => {
      const parse = otlpParser('auto', DEFAULT_DECODE_LIMITS);
      return handle(
        batch.map((b) => {
          const r = parse(b, 'otlp');
          if (!r.ok) throw new Error(`${r.reason}: ${r.detail}`);
          return record(r.value);
        }),
        ctx,
      );
    },
    outcomes,
    published,
  };
}

const sum = (o: Record<string, number>) => Object.values(o).reduce((a, b) => a + b, 0);

describe('ingest: every span read has one outcome (real Redis and Kafka)', () => {
  it('a tool span that waited for its agent span is counted once, as pending, not again when published', async () => {
    const spans = decodeRecorded(otelRecorder().agent({ name: 'A', tools: [{ name: 'a' }, { name: 'b' }] }));
    const tools = spans.filter((s) => s.name.startsWith('execute_tool'));
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    const { handle, outcomes, published } = await setup();
    await handle(tools);
    await handle(agent);
    expect(await published(1)).toEqual(['tool_call', 'tool_call', 'task_completed']);
    // Before: { pending: 2, tool_call: 2, agent: 1 }, five outcomes for three spans read.
    expect(await outcomes()).toEqual({ pending: 2, agent: 1 });
  });

  it('a chunk whose publication failed counts nothing: its retry counts each span once, `other` too', async () => {
    const spans = decodeRecorded(
      otelRecorder().agent({ name: 'A', tools: [{ name: 'a', viaInternalSpan: true }] }),
    );
    const { handle, outcomes, published } = await setup(1);
    await expect(handle(spans)).rejects.toThrow('broker unreachable');
    await handle(spans);
    expect(await published(1)).toEqual(['tool_call', 'task_completed']);
    // Before: other 2 (counted before the failed send, and again by the retry), the rest once.
    expect(await outcomes()).toEqual({ tool_call: 1, agent: 1, other: 1 });
  });

  it('a message read twice in one chunk: each copy of each span has one outcome, the copy of a published one late', async () => {
    const spans = decodeRecorded(otelRecorder().agent({ name: 'A', tools: [{ name: 'a' }, { name: 'b' }] }));
    const first = decodeRecorded(otelRecorder().agent({ name: 'B', tools: [{ name: 'c' }] })).filter((s) =>
      s.name.startsWith('execute_tool'),
    );
    const { handle, outcomes, published } = await setup();
    // The whole task, twice; a tool span whose agent span has not come, twice.
    await handle(spans, spans, first, first);
    expect(await published(1)).toEqual(['tool_call', 'tool_call', 'task_completed']);
    const o = await outcomes();
    // Before: { tool_call: 2, agent: 2, pending: 1 }: five outcomes for eight spans read.
    expect(o).toEqual({ tool_call: 2, late: 2, agent: 2, pending: 2 });
    expect(sum(o)).toBe(2 * spans.length + 2 * first.length);
  });

  it('a span with a malformed id is counted invalid, and the other spans of its request are handled', async () => {
    const recorded = otelRecorder().agent({ name: 'A', tools: [{ name: 'a' }, { name: 'b' }] });
    const doc = JSON.parse(toJson(recorded).toString()) as {
      resourceSpans: { scopeSpans: { spans: { name: string; spanId: string }[] }[] }[];
    };
    const spans = doc.resourceSpans[0]!.scopeSpans[0]!.spans;
    spans.find((s) => s.name.includes('execute_tool'))!.spanId = 'not-hex!';
    const { handleRaw, outcomes, published } = await setup();
    // Before: the parser refused the whole request (dead-lettered as invalid), the task lost with it.
    await handleRaw(Buffer.from(JSON.stringify(doc)));
    expect(await published(1)).toEqual(['tool_call', 'task_completed']);
    const o = await outcomes();
    expect(o).toEqual({ tool_call: 1, agent: 1, invalid: 1 });
    expect(sum(o)).toBe(spans.length);
  });
});
