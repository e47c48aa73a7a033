import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { consumeUntil, createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createIngestHandler, createIngestMetrics } from '../../src/adapters/handler.js';
import { RedisTraceStore } from '../../src/adapters/trace-store.js';
import { DEFAULT_MAP_OPTIONS } from '../../src/core/map.js';
import { decodeRecorded, deliverTo, otelRecorder } from '../helpers/otel.js';

/*
 * A tool call whose arguments and result, each under INGEST_MAX_PAYLOAD_BYTES, make an event over
 * PAVER_MAX_OUTPUT_BYTES (the variable allows up to 16 MiB per value; the output limit is 1,000,000 bytes by
 * default; a text result is counted in UTF-8 and grows up to six times as JSON). The sink left the whole
 * tool_call out: its task was published with a step missing (0, 2, …), as if the agent had never made that call.
 */

const LIMIT = 8 * 1024;
const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: LIMIT });
afterAll(async () => {
  await sink.disconnect();
  await redis.quit();
});

/** `paver_ingest_payloads_omitted_total` as [field, reason, count] rows, by field. */
const omittedCounts = async (registry: Registry) =>
  (await registry.getSingleMetric('paver_ingest_payloads_omitted_total')!.get()).values
    .map((v) => [v.labels.field, v.labels.reason, v.value])
    .sort((x, y) => String(x[0]).localeCompare(String(y[0])));

describe('ingest: a tool call too large for PAVER_MAX_OUTPUT_BYTES (real Redis and Kafka)', () => {
  it('is published without its result, else without its arguments, never left out', async () => {
    const big = 'x'.repeat(5 * 1024);
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [
        { name: 'small', args: { q: 1 }, result: { ok: true } },
        // Each value fits; the two together do not: the result goes, the arguments stay.
        { name: 'both', args: { text: big }, result: { text: big } },
        // A text result of control characters: 5 KiB counted, six times that as JSON.
        { name: 'escaped', args: { q: 2 }, result: '\u0001'.repeat(5 * 1024) },
        // The arguments alone are over the limit: they go, the result stays.
        { name: 'huge_args', args: { a: big, b: big }, result: { ok: true } },
        { name: 'last' },
      ],
    });
    const topic = unique('tool-calls');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const registry = new Registry();
    const handle = createIngestHandler({
      store: new RedisTraceStore(redis, unique('ingest'), 3_600_000),
      sink,
      topic,
      opts: { ...DEFAULT_MAP_OPTIONS, maxPayloadBytes: 16 * 1024 },
      metrics: createIngestMetrics(registry),
      maxOutputBytes: LIMIT,
    });
    await deliverTo(handle)(decodeRecorded(spans));

    const got = (
      await consumeUntil(topic, (all) => all.some((m) => m.value!.toString().includes('"task_completed"')))
    ).map((m) => JSON.parse(m.value!.toString()) as Record<string, unknown>);
    expect(
      got.map((e) => (e.type === 'tool_call' ? `${e.step as number}:${e.tool as string}` : e.type)),
    ).toEqual(['0:small', '1:both', '2:escaped', '3:huge_args', '4:last', 'task_completed']);
    const [small, both, escaped, huge] = got;
    expect(small).toMatchObject({ args: { q: 1 }, observation: { ok: true } });
    expect(both).toMatchObject({ args: { text: big } });
    expect(both).not.toHaveProperty('observation');
    expect(escaped).toMatchObject({ args: { q: 2 } });
    expect(escaped).not.toHaveProperty('observation');
    expect(huge).not.toHaveProperty('args');
    expect(huge).toMatchObject({ observation: { ok: true } });
    const omitted = (await registry.getSingleMetric('paver_ingest_payloads_omitted_total')!.get()).values;
    const n = (field: string) =>
      omitted.find((v) => v.labels.field === field && v.labels.reason === 'oversize')?.value ?? 0;
    expect([n('observation'), n('args')]).toEqual([2, 1]);
  });
});

describe('ingest: a tool span that waited in Redis through a restart that lowered INGEST_MAX_PAYLOAD_BYTES (real Redis and Kafka)', () => {
  it('is published under the limit in force now, as a fresh span is, and the payloads left out are counted', async () => {
    const spans = decodeRecorded(
      otelRecorder().agent({
        name: 'A',
        tools: [
          { name: 'large', args: { text: 'a'.repeat(3000) }, result: 'r'.repeat(3000) },
          { name: 'small', args: { q: 1 }, result: 'ok' },
        ],
      }),
    );
    const tools = spans.filter((s) => s.attributes['gen_ai.operation.name'] === 'execute_tool');
    const agent = spans.filter((s) => s.attributes['gen_ai.operation.name'] === 'invoke_agent');
    const topic = unique('tool-calls');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const prefix = unique('ingest');
    const handler = (maxPayloadBytes: number, registry: Registry) =>
      createIngestHandler({
        store: new RedisTraceStore(redis, prefix, 3_600_000),
        sink,
        topic,
        opts: { ...DEFAULT_MAP_OPTIONS, maxPayloadBytes },
        metrics: createIngestMetrics(registry),
      });
    // Before the restart: a 64 KiB limit, the tool spans wait in Redis with their payloads.
    await deliverTo(handler(64 * 1024, new Registry()))(tools);
    // After it: 1 KiB. The agent span comes.
    const registry = new Registry();
    await deliverTo(handler(1024, registry))(agent);

    const got = (
      await consumeUntil(topic, (all) => all.some((m) => m.value!.toString().includes('"task_completed"')))
    ).map((m) => JSON.parse(m.value!.toString()) as Record<string, unknown>);
    expect(got.map((e) => e.tool ?? e.type)).toEqual(['large', 'small', 'task_completed']);
    // Before, `large` went out with both 3,000-byte payloads.
    expect(got[0]).not.toHaveProperty('args');
    expect(got[0]).not.toHaveProperty('observation');
    expect(got[1]).toMatchObject({ args: { q: 1 }, observation: 'ok' });
    expect(await omittedCounts(registry)).toEqual([
      ['args', 'oversize', 1],
      ['observation', 'oversize', 1],
    ]);
  });
});

describe('ingest: payloads left out, counted once per chunk handled (real Redis and Kafka)', () => {
  it('a chunk whose publication failed does not count its omitted payloads again when read again', async () => {
    const spans = decodeRecorded(
      otelRecorder().agent({
        name: 'A',
        tools: [
          { name: 'waited', args: { text: 'a'.repeat(3000) } },
          { name: 'fresh', result: 'r'.repeat(3000) },
        ],
      }),
    );
    const waited = spans.filter((s) => s.name === 'execute_tool waited');
    const rest = spans.filter((s) => !waited.includes(s));
    const topic = unique('tool-calls');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const prefix = unique('ingest');
    let failing = 0;
    const handler = (maxPayloadBytes: number, registry: Registry) =>
      createIngestHandler({
        store: new RedisTraceStore(redis, prefix, 3_600_000),
        sink: {
          ...sink,
          send: (...args: Parameters<typeof sink.send>) =>
            failing-- > 0 ? Promise.reject(new Error('broker unreachable')) : sink.send(...args),
        },
        topic,
        opts: { ...DEFAULT_MAP_OPTIONS, maxPayloadBytes },
        metrics: createIngestMetrics(registry),
      });
    // One tool span waits under a 64 KiB limit; after a restart with 1 KiB, the rest of the task comes (its other
    // tool span's result over the limit as read), and the first send of that chunk fails.
    await deliverTo(handler(64 * 1024, new Registry()))(waited);
    const registry = new Registry();
    const deliver = deliverTo(handler(1024, registry));
    failing = 1;
    await expect(deliver(rest)).rejects.toThrow('broker unreachable');
    await deliver(rest);
    const got = (
      await consumeUntil(topic, (all) => all.some((m) => m.value!.toString().includes('"task_completed"')))
    ).map((m) => JSON.parse(m.value!.toString()) as Record<string, unknown>);
    expect(got.map((e) => e.tool ?? e.type)).toEqual(['waited', 'fresh', 'task_completed']);
    // Before: 2 each, counted by the failed attempt and again by the one that published.
    expect(await omittedCounts(registry)).toEqual([
      ['args', 'oversize', 1],
      ['observation', 'oversize', 1],
    ]);
  });
});
