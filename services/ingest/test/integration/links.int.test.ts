import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { consumeUntil, createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createIngestHandler, createIngestMetrics } from '../../src/adapters/handler.js';
import { RedisTraceStore } from '../../src/adapters/trace-store.js';
import { DEFAULT_MAP_OPTIONS, mapSpans } from '../../src/core/map.js';
import { decodeRecorded, deliverTo, otelRecorder } from '../helpers/otel.js';

/*
 * A tool span whose parent is a plain (non-GenAI) span, exported in three messages: the tool span, then its
 * parent alone, then the agent span. The parent's message holds links only; it used to be dropped before Redis
 * was read, so the tool span never reached its agent and the whole task was never published.
 */

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  await redis.quit();
});

const decode = decodeRecorded;

describe('ingest: a span between a tool and its agent, exported alone (real Redis and Kafka)', () => {
  it('keeps the link while a tool span waits for it, and publishes the task once the agent span comes', async () => {
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [{ name: 'one' }, { name: 'two', viaInternalSpan: true }],
    });
    const tools = spans.filter((s) => s.name.startsWith('execute_tool'));
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    const between = spans.filter((s) => !tools.includes(s) && !agent.includes(s));
    expect(between).toHaveLength(1);

    const topic = unique('tool-calls');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const handle = createIngestHandler({
      store: new RedisTraceStore(redis, unique('ingest'), 3_600_000),
      sink,
      topic,
      opts: DEFAULT_MAP_OPTIONS,
      metrics: createIngestMetrics(new Registry()),
    });
    const send = deliverTo(handle);
    const deliver = (part: typeof spans) => send(decode(part));
    await deliver(tools);
    await deliver(between);
    await deliver(agent);

    // What the whole trace in one message gives.
    const want = mapSpans(decode(spans), DEFAULT_MAP_OPTIONS).events;
    const got = await consumeUntil(topic, (all) => all.length >= want.length);
    expect(got.map((m) => JSON.parse(m.value!.toString()) as unknown)).toEqual(
      want.map((e) => JSON.parse(JSON.stringify(e)) as unknown),
    );
  });
});
