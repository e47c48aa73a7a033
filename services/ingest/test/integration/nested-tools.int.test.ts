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
 * A tool called over MCP with both sides instrumented (the conventions' mcp.md, "Tool call"): the MCP client's
 * execute_tool span and, below it, the MCP server's execute_tool span of the same tool. The server, another
 * process, exports its span first, alone; the agent's process exports the rest later. Each execute_tool span
 * used to be a step: the one call read as the tool called twice in a row.
 */

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  await redis.quit();
});

describe('ingest: an MCP tool call traced on both sides (real Redis and Kafka)', () => {
  it('publishes the call once; the server span waits for its parent, then leaves the trace', async () => {
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [{ name: 'get_user' }, { name: 'get_weather', mcpServer: true }, { name: 'reply' }],
    });
    const server = spans.filter((s) => s.name.startsWith('tools/call'));
    const agent = spans.filter((s) => s.name.startsWith('invoke_agent'));
    const tools = spans.filter((s) => !server.includes(s) && !agent.includes(s));
    expect(server).toHaveLength(1);

    const topic = unique('tool-calls');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const prefix = unique('ingest');
    const handle = createIngestHandler({
      store: new RedisTraceStore(redis, prefix, 3_600_000),
      sink,
      topic,
      opts: DEFAULT_MAP_OPTIONS,
      metrics: createIngestMetrics(new Registry()),
    });
    const send = deliverTo(handle);
    await send(decodeRecorded(server));
    await send(decodeRecorded(tools));
    await send(decodeRecorded(agent));

    const got = (
      await consumeUntil(topic, (all) =>
        all.some((m) => (JSON.parse(m.value!.toString()) as { type: string }).type === 'task_completed'),
      )
    ).map((m) => JSON.parse(m.value!.toString()) as { type: string; tool?: string; step?: number });
    expect(got.map((e) => (e.type === 'tool_call' ? `${e.step}:${e.tool}` : e.type))).toEqual([
      '0:get_user',
      '1:get_weather',
      '2:reply',
      'task_completed',
    ]);
    // What the whole trace in one message gives (paver otel).
    expect(got).toEqual(
      mapSpans(decodeRecorded(spans), DEFAULT_MAP_OPTIONS).events.map(
        (e) => JSON.parse(JSON.stringify(e)) as unknown,
      ),
    );
    // The server span waited in the trace's hash, and left it with the task.
    const traceId = server[0]!.spanContext().traceId;
    const fields = await redis.hkeys(`${prefix}:ingest:trace:${traceId}`);
    expect(fields.filter((f) => f.startsWith('s:'))).toEqual([]);
  });
});
