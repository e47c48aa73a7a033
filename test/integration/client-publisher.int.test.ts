import { createConnection, createServer, type Server } from 'node:net';
import { ConfigResourceTypes, Partitioners } from 'kafkajs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPublisher, DEFAULT_MAX_MESSAGE_BYTES, type ToolCallInput } from '../../client/index.js';
import { toolCallsEventV1 } from '../../schemas/index.js';
import { registryCodec } from '../../shared/codec.js';
import { recordBatchBytes } from '../../shared/kafka/requests.js';
import { consumeUntil, createTopics, stack, testKafka, unique } from '../helpers/kafka.js';
import { startRegistryDouble } from '../helpers/registry-double.js';
import { freePort } from '../../deploy/local/stack.js';

let reg: Awaited<ReturnType<typeof startRegistryDouble>>;
beforeAll(async () => (reg = await startRegistryDouble()));
afterAll(() => reg.close());

/** Two sessions, interleaved call by call, so per-session order is not a side effect of sending order. */
async function publishInterleaved(pub: ReturnType<typeof createPublisher>) {
  const calls: Promise<void>[] = [];
  for (let step = 0; step < 5; step++) {
    for (const s of ['alpha', 'beta']) {
      calls.push(pub.toolCall({ session_id: `sess-${s}`, task_id: `task-${s}`, tool: `tool_${step}` }));
    }
  }
  for (const s of ['alpha', 'beta'])
    calls.push(pub.taskCompleted({ session_id: `sess-${s}`, task_id: `task-${s}` }));
  await pub.flush();
  await Promise.all(calls);
}

/**
 * Two events, every generated field given so that their encoded size is known to the byte: `fits` goes out in a
 * record batch of exactly `limit` bytes as the broker counts it (key and framing included), `over` in one byte
 * more (tool names of one length).
 */
function atLimit(limit: number) {
  const session = 'session-0123456789abcdef';
  const event = (tool: string, observation: string) => ({
    session_id: session,
    task_id: 't',
    tool,
    step: 0,
    event_id: '00000000-0000-4000-8000-000000000000',
    ts: 1_700_000_000_000,
    tenant_id: 'acme',
    agent_id: 'bot',
    observation,
  });
  const batchBytes = (observation: string) =>
    recordBatchBytes(
      Buffer.byteLength(session),
      Buffer.byteLength(
        JSON.stringify(toolCallsEventV1.parse({ type: 'tool_call', ...event('fits', observation) })),
      ),
    );
  // The observation that makes the record batch exactly the limit (the lengths' varints grow with it).
  let pad = limit - batchBytes('');
  while (batchBytes('x'.repeat(pad)) > limit) pad--;
  const fits = 'x'.repeat(pad);
  expect(batchBytes(fits)).toBe(limit);
  return { fits: event('fits', fits), over: event('over', `${fits}x`) };
}

/** The broker's side of a boundary: a publisher letting `over` past (its limit `lax`) has it refused by the broker. */
async function expectBrokerRefuses(topic: string, lax: number, over: ToolCallInput) {
  const pub = createPublisher({
    brokers: [stack().brokers],
    topic,
    maxMessageBytes: lax,
    kafka: { retry: { retries: 0 } },
  });
  await expect(pub.toolCall(over)).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
  await pub.close();
}

describe('client publisher (real broker)', () => {
  it('uses a producer it is given (and leaves it connected), keys by session_id, keeps each session in order', async () => {
    const topic = unique('client-given');
    await createTopics([{ topic, partitions: 3 }]);
    const producer = testKafka().producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    const pub = createPublisher({ producer, topic, tenantId: 'acme', agentId: 'bot' });
    await publishInterleaved(pub);
    await pub.close();
    // Still the owner's: it sends after the publisher is closed.
    await producer.send({ topic, messages: [{ key: 'owner', value: '{}' }] });
    await producer.disconnect();

    const all = await consumeUntil(topic, (m) => m.length >= 13);
    const events = all.filter((m) => m.key !== 'owner');
    expect(events).toHaveLength(12);
    for (const s of ['alpha', 'beta']) {
      const mine = events.filter((m) => m.key === `sess-${s}`);
      expect(new Set(mine.map((m) => m.partition)).size).toBe(1);
      const parsed = mine
        .sort((a, b) => Number(a.offset) - Number(b.offset))
        .map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())));
      expect(parsed.map((e) => (e.type === 'tool_call' ? e.step : 'done'))).toEqual([0, 1, 2, 3, 4, 'done']);
      expect(
        parsed.every((e) => e.tenant_id === 'acme' && e.agent_id === 'bot' && e.session_id === `sess-${s}`),
      ).toBe(true);
      expect(new Set(parsed.map((e) => e.event_id)).size).toBe(6);
    }
  });

  it('writes the Confluent wire format when a schema registry is configured', async () => {
    const topic = unique('client-registry');
    await createTopics([{ topic, partitions: 1 }]);
    const pub = createPublisher({ brokers: [stack().brokers], topic, schemaRegistry: reg.url });
    await publishInterleaved(pub);
    await pub.close();

    const all = await consumeUntil(topic, (m) => m.length >= 12);
    const codec = registryCodec({ url: reg.url });
    for (const m of all) {
      expect(m.value![0]).toBe(0);
      const decoded = toolCallsEventV1.parse(await codec.decode(m.value!));
      expect(decoded.session_id).toBe(m.key);
    }
    expect([...reg.schemas.values()].map((s) => s.schemaType)).toContain('JSON');
  });

  it("splits a burst into produce requests under the broker's record-batch limit: a session's events of 200 KB each, queued at once, all land in order", async () => {
    const topic = unique('client-burst');
    await createTopics([{ topic, partitions: 1 }]);
    // Each event is well under the 1 MiB default limit; twenty of them in one record batch are not.
    const pub = createPublisher({ brokers: [stack().brokers], topic });
    const big = 'x'.repeat(200 * 1024);
    const calls = Array.from({ length: 20 }, (_, step) =>
      pub.toolCall({ session_id: 's', task_id: 't', tool: `tool_${step}`, observation: big }),
    );
    await pub.close();
    await Promise.all(calls);
    const got = await consumeUntil(topic, (m) => m.length >= 20);
    const steps = got
      .sort((a, b) => Number(a.offset) - Number(b.offset))
      .map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())))
      .map((e) => (e.type === 'tool_call' ? e.step : -1));
    expect(steps).toEqual(Array.from({ length: 20 }, (_, i) => i));
  });

  it("holds an event to the broker's limit as the broker counts it (key and framing included): one byte under lands, one byte over is the client's INPUT_INVALID, and the broker agrees at that byte", async () => {
    const limit = 1024 * 1024;
    const topic = unique('client-limit');
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': String(limit) } }]);
    const { fits, over } = atLimit(limit);
    const pub = createPublisher({ brokers: [stack().brokers], topic, maxMessageBytes: limit });
    // Before: checked against the value alone, this one (80 bytes of framing and key under the value limit)
    // passed the client and the broker refused it.
    await expect(pub.toolCall(over)).rejects.toMatchObject({ code: 'INPUT_INVALID' });
    await pub.toolCall(fits);
    // The refusal reached the caller through the call it awaited: close() does not report it again.
    await pub.close();
    await expectBrokerRefuses(topic, limit + 1, over);
    const got = await consumeUntil(topic, (m) => m.length >= 1);
    expect(got.map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())))).toMatchObject([
      { tool: 'fits' },
    ]);
  });

  it("takes by default what a default broker takes: an event of exactly its message.max.bytes (1,048,588) lands, one byte over is the client's INPUT_INVALID, and the broker refuses that byte", async () => {
    const topic = unique('client-default-limit');
    // The topic's own limit left unset: the broker's message.max.bytes, at Kafka's default on the test broker.
    await createTopics([{ topic, partitions: 1 }]);
    const admin = testKafka().admin();
    await admin.connect();
    try {
      const { resources } = await admin.describeConfigs({
        resources: [{ type: ConfigResourceTypes.TOPIC, name: topic, configNames: ['max.message.bytes'] }],
        includeSynonyms: false,
      });
      expect(resources[0]?.configEntries[0]?.configValue).toBe(String(DEFAULT_MAX_MESSAGE_BYTES));
    } finally {
      await admin.disconnect();
    }
    expect(DEFAULT_MAX_MESSAGE_BYTES).toBe(1_048_588);
    const { fits, over } = atLimit(DEFAULT_MAX_MESSAGE_BYTES);
    const pub = createPublisher({ brokers: [stack().brokers], topic });
    // Before: the default was 1 MiB, 12 bytes under the broker's, and this event was refused as INPUT_INVALID.
    await pub.toolCall(fits);
    await expect(pub.toolCall(over)).rejects.toMatchObject({ code: 'INPUT_INVALID' });
    await pub.close();
    await expectBrokerRefuses(topic, DEFAULT_MAX_MESSAGE_BYTES + 1, over);
    const got = await consumeUntil(topic, (m) => m.length >= 1);
    expect(got.map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())))).toMatchObject([
      { tool: 'fits' },
    ]);
  });

  it("holds a session's later events back when one fails to send: none lands after the gap, other sessions go on, and the retry lands in order", async () => {
    const topic = unique('client-gap');
    // A topic whose limit is under the publisher's: the broker itself refuses the large event.
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': '20000' } }]);
    // One send per event, so the events behind the failed one are in sends of their own.
    const pub = createPublisher({ brokers: [stack().brokers], topic, batchSize: 1 });
    const call = (session: string, tool: string, observation?: string) =>
      pub.toolCall({ session_id: session, task_id: 't', tool, observation });
    const first = [
      call('s', 'big', 'x'.repeat(50_000)),
      call('s', 'after_1'),
      call('s', 'after_2'),
      call('other', 'independent'),
    ];
    const results = await Promise.allSettled(first);
    // Before: after_1 and after_2 were acknowledged, and the session read steps 1 and 2 without 0.
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected', 'rejected', 'fulfilled']);
    for (const r of results.slice(0, 3))
      expect((r as PromiseRejectedResult).reason).toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    // The caller had every failure (it awaited them): its retry goes out, with the steps the calls had.
    await call('s', 'small');
    await call('s', 'after_1');
    await call('s', 'after_2');
    await pub.close();
    const got = await consumeUntil(topic, (m) => m.length >= 4);
    const events = got
      .sort((a, b) => Number(a.offset) - Number(b.offset))
      .map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())))
      .filter((e) => e.type === 'tool_call' && e.session_id === 's');
    expect(events.map((e) => (e.type === 'tool_call' ? [e.tool, e.step] : []))).toEqual([
      ['small', 0],
      ['after_1', 1],
      ['after_2', 2],
    ]);
    expect(got).toHaveLength(4);
  });

  it('holds a session whose event failed to encode (registry down): its events queued behind it are rejected, other sessions publish, and once the caller has had the failure the session lands in call order', async () => {
    const topic = unique('client-encode-hold');
    // One partition: the order on Kafka across sessions is the order the broker took them in.
    await createTopics([{ topic, partitions: 1 }]);
    const pub = createPublisher({ brokers: [stack().brokers], topic, schemaRegistry: reg.url });
    const call = (session: string, tool: string) => pub.toolCall({ session_id: session, task_id: 't', tool });
    reg.setDown(true);
    let lost: Promise<void>[];
    try {
      // Queued together: b waits behind a, whose encode (the schema's registration) fails.
      lost = [call('s', 'a'), call('s', 'b')];
      // Waits for the failures without taking the calls up, as a fire-and-forget agent does.
      await Promise.allSettled(lost.map((l) => Promise.prototype.then.call(l, undefined, () => undefined)));
    } finally {
      reg.setDown(false);
    }
    // The caller has not had those failures yet: the session's next call is refused, another session publishes.
    const later = call('s', 'c');
    await call('other', 'x');
    await expect(later).rejects.toMatchObject({
      code: 'REGISTRY_UNAVAILABLE',
      message: expect.stringMatching(/^not sent: an earlier event of its session failed to encode/),
    });
    await expect(pub.flush()).rejects.toMatchObject({ code: 'REGISTRY_UNAVAILABLE' });
    await expect(lost[0]).rejects.toMatchObject({
      code: 'REGISTRY_UNAVAILABLE',
      message: expect.not.stringMatching(/^not sent/),
    });
    await expect(lost[1]).rejects.toMatchObject({
      code: 'REGISTRY_UNAVAILABLE',
      message: expect.stringMatching(/^not sent: an earlier event of its session failed to encode/),
    });
    // Had (by flush()): the session goes out again, retried from the call that failed, with the steps it had.
    await call('s', 'a');
    await call('s', 'b');
    await call('s', 'c');
    await pub.close();
    const got = await consumeUntil(topic, (m) => m.length >= 4);
    const codec = registryCodec({ url: reg.url });
    const events = await Promise.all(
      got
        .sort((a, b) => Number(a.offset) - Number(b.offset))
        .map(async (m) => toolCallsEventV1.parse(await codec.decode(m.value!))),
    );
    expect(events.map((e) => (e.type === 'tool_call' ? [e.session_id, e.tool, e.step] : []))).toEqual([
      ['other', 'x', 0],
      ['s', 'a', 0],
      ['s', 'b', 1],
      ['s', 'c', 2],
    ]);
    expect(got).toHaveLength(4);
  });

  it('rejects every queued event when the broker cannot take them, instead of losing them silently', async () => {
    const pub = createPublisher({
      brokers: [stack().brokers],
      topic: unique('client-missing'), // never created; auto-creation is off on the test broker
      kafka: { retry: { retries: 1, initialRetryTime: 50, maxRetryTime: 200 } },
    });
    const p = pub.toolCall({ session_id: 's', task_id: 't', tool: 'x' });
    // Fire-and-forget callers learn it from flush(); those that await the event learn it there.
    await expect(pub.flush()).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(p).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(pub.close()).resolves.toBeUndefined();
  });

  it('connects again after a failed first connection: a broker that was down when the agent started is used once it is up', async () => {
    const topic = unique('client-reconnect');
    await createTopics([{ topic, partitions: 1 }]);
    // The bootstrap address forwards to the test broker only once it listens: nothing answers there at first.
    const port = await freePort();
    const [host, brokerPort] = stack().brokers.split(':') as [string, string];
    let forwarder: Server | undefined;
    const pub = createPublisher({
      brokers: [`127.0.0.1:${port}`],
      topic,
      kafka: { retry: { retries: 0 }, connectionTimeout: 1000 },
    });
    try {
      await expect(pub.toolCall({ session_id: 's', task_id: 't', tool: 'while_down' })).rejects.toMatchObject(
        { code: 'KAFKA_UNAVAILABLE' },
      );
      // That failure reached the caller through the call: flush() has nothing more to say.
      await pub.flush();
      forwarder = createServer((c) => {
        const up = createConnection({ host, port: Number(brokerPort) });
        c.pipe(up).pipe(c);
        c.on('error', () => up.destroy());
        up.on('error', () => c.destroy());
      });
      await new Promise<void>((r) => forwarder!.listen(port, '127.0.0.1', r));
      // Before: the first connection's rejection was kept, and every later event failed with it, for ever.
      await pub.toolCall({ session_id: 's', task_id: 't', tool: 'once_up' });
      await pub.close();
      const got = await consumeUntil(topic, (m) => m.length >= 1);
      expect(got.map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())))).toMatchObject([
        { tool: 'once_up' },
      ]);
    } finally {
      await pub.close().catch(() => undefined);
      forwarder?.close();
    }
  });
});
