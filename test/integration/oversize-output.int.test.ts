import { afterAll, describe, expect, it } from 'vitest';
import type { NextActionRecord } from '../../schemas/index.js';
import { jsonCodec } from '../../shared/codec.js';
import { messageBytes } from '../../shared/kafka/dead-letter.js';
import { createSink } from '../../shared/kafka/sink.js';
import { createMetrics } from '../../shared/metrics.js';
import { withoutArguments } from '../../services/autoseq/src/core/decide.js';
import {
  policyRecord,
  startAutoseq,
  toolRecord,
} from '../../services/autoseq/test/integration/predict-compare.js';
import {
  consumeUntil,
  createTopics,
  groupCaughtUp,
  produce,
  testKafka,
  unique,
  waitFor,
} from '../helpers/kafka.js';
import { getJson, serviceEnv, type Proc } from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';

/*
 * An output can be bigger than the input it came from: autoseq copies an executable decision's input (the
 * previous tool's output) into `arguments`, and adds its own fields. An input just under the limits then gave
 * an output the broker refused as too large; the runner took that as fatal and the service exited, again at
 * every restart, since the batch was never committed. Outputs over PAVER_MAX_OUTPUT_BYTES are now made to fit
 * where their contract allows, or left out and counted.
 */

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

const record = (id: string, extra: Partial<NextActionRecord> = {}): NextActionRecord => ({
  schema_version: 1,
  tenant_id: 'acme',
  agent_id: 'a1',
  session_id: 's1',
  task_id: 't1',
  event_id: id,
  step: 1,
  ts: 1,
  event_type: 'auto_seq_detected_unique',
  tool: 'next_tool',
  execute: true,
  ...extra,
});

describe('outputs over PAVER_MAX_OUTPUT_BYTES (real Kafka)', () => {
  it('the sink trims what its contract allows, leaves out the rest, counts both, and sends the others', async () => {
    const topic = unique('oversize');
    await createTopics([{ topic, partitions: 1 }]);
    const metrics = createMetrics('test');
    const dropped: number[] = [];
    const sink = createSink(testKafka(), jsonCodec(), metrics, {
      maxRecordBytes: 2_000,
      onDropped: (_t, bytes) => dropped.push(bytes),
    });
    await sink.connect();
    try {
      const big = { text: 'x'.repeat(5_000) };
      await sink.send(
        topic,
        'next-actions.v1',
        [
          { key: 's1', value: record('small') },
          { key: 's1', value: record('trimmed', { arguments: big }) },
          // Nothing to leave out: too big as it is.
          {
            key: 's1',
            value: record('dropped', {
              candidates: Array.from({ length: 20 }, (_, i) => `t${i}`.padEnd(200, 'x')),
            }),
          },
          { key: 's1', value: record('after') },
        ],
        withoutArguments,
      );
      const got = await consumeUntil(topic, (all) => all.length >= 3);
      const values = got.map((m) => JSON.parse(m.value!.toString()) as NextActionRecord);
      expect(values.map((v) => v.event_id)).toEqual(['small', 'trimmed', 'after']);
      expect(values[1]).toMatchObject({ arguments_omitted: true, execute: true });
      expect(values[1]!.arguments).toBeUndefined();
      expect(dropped).toHaveLength(1);
      expect(dropped[0]).toBeGreaterThan(2_000);
      const m = parsePrometheus(await metrics.registry.metrics());
      expect(m.value('paver_outputs_oversize_total', { topic, outcome: 'trimmed' })).toBe(1);
      expect(m.value('paver_outputs_oversize_total', { topic, outcome: 'dropped' })).toBe(1);
    } finally {
      await sink.disconnect();
    }
  });

  it('holds a record to PAVER_MAX_OUTPUT_BYTES as the broker counts it (framing, key, headers): at the limit a topic of that max.message.bytes takes it, one byte over is trimmed by the sink, and the broker refuses that byte', async () => {
    const limit = 100_000;
    const topic = unique('oversize-exact');
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': String(limit) } }]);
    const metrics = createMetrics('test');
    const sink = createSink(testKafka(), jsonCodec(), metrics, { maxRecordBytes: limit });
    const headers = { traceparent: '00-0123456789abcdef0123456789abcdef-0123456789abcdef-01' };
    const value = (id: string, text: string) => record(id, { arguments: { text } });
    const size = (id: string, text: string) =>
      messageBytes({ key: 's1', value: JSON.stringify(value(id, text)), headers });
    // The text that makes the record exactly the limit (the lengths' varints grow with it).
    let pad = limit - size('fits', '');
    while (size('fits', 'x'.repeat(pad)) > limit) pad--;
    const text = 'x'.repeat(pad);
    expect(size('fits', text)).toBe(limit);
    // Same length of event_id: one byte over the limit.
    expect(size('over', `${text}x`)).toBe(limit + 1);
    await sink.connect();
    try {
      // Before: checked by key and value only (about 150 bytes under the limit), the one over went out and the
      // broker refused it: a configuration error that stopped the service.
      await sink.send(
        topic,
        'next-actions.v1',
        [
          { key: 's1', value: value('fits', text), headers },
          { key: 's1', value: value('over', `${text}x`), headers },
        ],
        withoutArguments,
      );
      const got = await consumeUntil(topic, (all) => all.length >= 2);
      const values = got.map((m) => JSON.parse(m.value!.toString()) as NextActionRecord);
      expect(values.map((v) => [v.event_id, v.arguments_omitted ?? false])).toEqual([
        ['fits', false],
        ['over', true],
      ]);
      expect(values[0]!.arguments).toEqual({ text });
      expect(got[0]!.headers).toEqual(headers);
      const m = parsePrometheus(await metrics.registry.metrics());
      expect(m.value('paver_outputs_oversize_total', { topic, outcome: 'trimmed' })).toBe(1);
      // The broker's side of that byte: the record the sink trimmed, sent as it was, is refused.
      await expect(
        sink.sendRaw(topic, [{ key: 's1', value: JSON.stringify(value('over', `${text}x`)), headers }]),
      ).rejects.toThrow(/larger than the max message size|too large/i);
    } finally {
      await sink.disconnect();
    }
  });

  it('records under the limit together go in requests whose record batches the topic takes, headers and framing counted', async () => {
    const limit = 100_000;
    const topic = unique('oversize-together');
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': String(limit) } }]);
    const sink = createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: limit });
    // Two records whose keys and values come to 20 bytes under the limit, their headers to 400 bytes more.
    const headers = { a: 'y'.repeat(199), b: 'z'.repeat(199) };
    const raw = (i: number) => ({ key: 's1', value: 'x'.repeat(limit / 2 - 12), headers, i });
    const kv = (r: ReturnType<typeof raw>) => Buffer.byteLength(r.key) + Buffer.byteLength(r.value);
    expect(kv(raw(0)) + kv(raw(1))).toBe(limit - 20);
    const text = 'x'.repeat(limit / 2 - 400);
    const out = (id: string) => ({ key: 's1', value: record(id, { arguments: { text } }), headers });
    const outBytes = (id: string) =>
      Buffer.byteLength('s1') + Buffer.byteLength(JSON.stringify(out(id).value));
    expect(outBytes('a') + outBytes('b')).toBeLessThanOrEqual(limit);
    await sink.connect();
    try {
      // Before: cut by keys and values only, each pair went as one record batch, over the limit: the raw pair
      // was refused as too large, the output pair as a configuration error.
      await sink.sendRaw(
        topic,
        [raw(0), raw(1)].map(({ key, value, headers: h }) => ({ key, value, headers: h })),
      );
      await sink.send(topic, 'next-actions.v1', [out('a'), out('b')]);
      const got = await consumeUntil(topic, (all) => all.length >= 4);
      expect(got).toHaveLength(4);
      expect(got.slice(2).map((m) => (JSON.parse(m.value!.toString()) as NextActionRecord).event_id)).toEqual(
        ['a', 'b'],
      );
    } finally {
      await sink.disconnect();
    }
  });

  it('a topic whose limit is under PAVER_MAX_OUTPUT_BYTES: a configuration error that says so', async () => {
    const topic = unique('oversize-small');
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': '2000' } }]);
    const sink = createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: 10_000 });
    await sink.connect();
    try {
      await expect(
        sink.send(topic, 'next-actions.v1', [
          { key: 's1', value: record('big', { arguments: { text: 'x'.repeat(5_000) } }) },
        ]),
      ).rejects.toThrow(/PAVER_MAX_OUTPUT_BYTES under the topic's max\.message\.bytes/);
    } finally {
      await sink.disconnect();
    }
  });

  it('requests are cut under the limit: a topic whose max.message.bytes is above it takes every record', async () => {
    const topic = unique('oversize-batch');
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': '100000' } }]);
    const sink = createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: 50_000 });
    await sink.connect();
    try {
      // Ten 40 KB records: one 400 KB request (one record batch) before, which this topic refuses.
      const records = Array.from({ length: 10 }, (_, i) => ({
        key: 's1',
        value: record(`r${i}`, { arguments: { text: 'x'.repeat(40_000) } }),
      }));
      await sink.send(topic, 'next-actions.v1', records);
      expect(await consumeUntil(topic, (all) => all.length >= 10)).toHaveLength(10);
      // Records that must not be left out fail the send instead.
      await expect(
        sink.send(
          topic,
          'next-actions.v1',
          [{ key: 's1', value: record('big', { arguments: { text: 'x'.repeat(60_000) } }) }],
          'keep',
        ),
      ).rejects.toThrow(/must not be left out/);
    } finally {
      await sink.disconnect();
    }
  });

  it('raw records (state copies, dead letters) are cut the same way: a copy of many states fits the topic', async () => {
    const topic = unique('oversize-raw');
    await createTopics([{ topic, partitions: 1, config: { 'max.message.bytes': '100000' } }]);
    const sink = createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: 50_000 });
    await sink.connect();
    try {
      // Forty 10 KB states of one batch: one 400 KB record batch before, which this topic refuses.
      const records = Array.from({ length: 40 }, (_, i) => ({ key: `s${i}`, value: 'x'.repeat(10_000) }));
      await sink.sendRaw(topic, records);
      const got = await consumeUntil(topic, (all) => all.length >= 40);
      // In order: a key's records keep theirs across requests.
      expect(got.map((m) => m.key!.toString())).toEqual(records.map((r) => r.key));
    } finally {
      await sink.disconnect();
    }
  });

  it('autoseq keeps running when an executable decision would copy an input just under the limit', async () => {
    const env = serviceEnv({
      AUTOSEQ_GROUP_ID: unique('as'),
      PAVER_TOPIC_TOOL_CATALOG: unique('catalog'),
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_NEXT_ACTIONS! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_TOOL_CATALOG!, compacted: true },
    ]);
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [
      policyRecord(),
      toolRecord('uppercase', {
        type: 'object',
        properties: { text: { type: 'string' } },
        required: ['text'],
      }),
    ]);
    const event = (id: string, step: number, text: string) =>
      JSON.stringify({
        type: 'tool_call',
        event_id: id,
        ts: 1_700_000_000_000 + step,
        tenant_id: 'default',
        agent_id: 'default',
        session_id: `s-${id}`,
        task_id: `t-${id}`,
        step,
        tool: 'fetch',
        observation: { text },
      });
    // 1,048,480 bytes: under PAVER_MAX_MESSAGE_BYTES (1 MiB) and the broker's default limit; its decision,
    // with the observation as `arguments`, is over both.
    const size = 1_048_480;
    const bigEvent = event('big', 1, 'x'.repeat(size - event('big', 1, '').length));
    expect(Buffer.byteLength(bigEvent)).toBe(size);
    const p = await startAutoseq(env, procs);
    // Apart: the broker's limit is per record batch.
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [{ key: 's-big', value: bigEvent }]);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [{ key: 's-small', value: event('small', 1, 'hello') }]);
    await waitFor(
      () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'both events consumed and committed',
    );
    expect(p.child.exitCode).toBeNull();
    const out = await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => all.length >= 2);
    const byId = new Map(
      out.map((m) => {
        const v = JSON.parse(m.value!.toString()) as NextActionRecord;
        return [v.event_id, v];
      }),
    );
    expect(byId.get('big')).toMatchObject({ tool: 'uppercase', execute: true, arguments_omitted: true });
    expect(byId.get('big')!.arguments).toBeUndefined();
    expect(byId.get('small')).toMatchObject({ tool: 'uppercase', arguments: { text: 'hello' } });
    const m = parsePrometheus((await getJson(p.url('/metrics'))).body as string);
    expect(
      m.value('paver_outputs_oversize_total', { topic: env.PAVER_TOPIC_NEXT_ACTIONS!, outcome: 'trimmed' }),
    ).toBe(1);
  });
});
