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
 * The same spans, cut into messages two ways: the whole trace in one message (a short run, one batch of the
 * SDK's exporter), and each span in its own message in the order the SDK exports them (a long run). Spans end,
 * and are exported, child first: a span enclosing an agent span (the outer agent of an agent invoked as a
 * tool, a request's root span) comes after it. The task's session and tenant were read from such spans too, so
 * they depended on where the messages were cut: the same event ids under another session_id (another
 * partition key) and tenant_id, and paver otel (the whole file at once) disagreeing with the service.
 */

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  await redis.quit();
});

type Spans = ReturnType<ReturnType<typeof otelRecorder>['agent']>;

/** What a fresh ingest (its own Redis prefix and output topic) publishes for `messages`, in order. */
async function ingest(messages: Spans[], expected: number): Promise<unknown[]> {
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
  for (const m of messages) await send(decodeRecorded(m));
  const got = await consumeUntil(topic, (all) => all.length >= expected);
  return got.map((m) => JSON.parse(m.value!.toString()) as unknown);
}

describe('ingest: events do not depend on where the messages are cut (real Redis and Kafka)', () => {
  it('gives each task the same session and tenant, one message or one span per message, and as paver otel', async () => {
    const rec = otelRecorder();
    const traces = [
      // An agent invoked as a tool, inside an agent that names the conversation and the tenant.
      rec.agent({
        name: 'Outer',
        conversationId: 'conv-1',
        tenant: 'acme',
        tools: [
          { name: 'plan' },
          { name: 'ask_expert', subAgent: { name: 'Expert', tools: [{ name: 'read' }, { name: 'write' }] } },
        ],
      }),
      // An agent inside a request's root span that carries them.
      rec.agent({ name: 'Chat', tools: [{ name: 'lookup' }] }, 1_700_000_100_000, {
        'gen_ai.conversation.id': 'conv-2',
        'paver.tenant_id': 'globex',
      }),
    ];
    const offline = mapSpans(decodeRecorded(traces.flat()), DEFAULT_MAP_OPTIONS).events.map(
      (e) => JSON.parse(JSON.stringify(e)) as unknown,
    );
    expect(offline).toHaveLength(8);
    const whole = await ingest(traces, offline.length);
    const split = await ingest(
      traces.flatMap((t) => t.map((s) => [s])),
      offline.length,
    );
    // Tasks come out in the order their agent spans came in (one span per message: the inner agent's first);
    // each task's events, in order, must be the same.
    const byTask = (events: unknown[]) => {
      const tasks = new Map<string, unknown[]>();
      for (const e of events) {
        const id = (e as { task_id: string }).task_id;
        tasks.set(id, [...(tasks.get(id) ?? []), e]);
      }
      return Object.fromEntries([...tasks].sort(([x], [y]) => (x < y ? -1 : 1)));
    };
    const keys = (events: unknown[]) =>
      Object.values(byTask(events)).map((task) =>
        (task as Record<string, string>[]).map((e) => `${e.session_id} ${e.tenant_id}`),
      );
    expect(keys(split)).toEqual(keys(whole));
    expect(byTask(split)).toEqual(byTask(whole));
    expect(byTask(whole)).toEqual(byTask(offline));
  });

  it('keeps an argument named __proto__ when the tool span waited in Redis for its agent span', async () => {
    // Arguments are the model's: a key the JSON text names `__proto__` is a key like any other.
    const args = JSON.parse('{"__proto__":{"x":"1"},"q":"a"}') as unknown;
    const trace = otelRecorder().agent({ name: 'A', tools: [{ name: 'lookup', args }] });
    const argKeys = (events: unknown[]) =>
      events.flatMap((e) => {
        const a = (e as { args?: object }).args;
        return a ? [Object.keys(a).sort()] : [];
      });
    const offline = mapSpans(decodeRecorded(trace), DEFAULT_MAP_OPTIONS).events;
    expect(argKeys(offline)).toEqual([['__proto__', 'q']]);
    expect(argKeys(await ingest([trace], 2))).toEqual([['__proto__', 'q']]);
    // One span per message: the tool span waits in Redis, and was read back without that key.
    expect(
      argKeys(
        await ingest(
          trace.map((s) => [s]),
          2,
        ),
      ),
    ).toEqual([['__proto__', 'q']]);
  });
});
