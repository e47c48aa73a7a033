import { createHash } from 'node:crypto';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  createTopics,
  consumeUntil,
  groupCaughtUp,
  produce,
  produceInTransactions,
  testRedis,
  unique,
  waitFor,
} from '../helpers/kafka.js';
import {
  explained,
  getJson,
  killAll,
  serviceEnv,
  startProcess,
  startReady,
  type Proc,
} from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';
import { createRecorderTopics, RECORDER, recorderEvent } from '../helpers/recorder.js';
import { jsonCodec } from '../../shared/codec.js';
import { buildDeadLetter, messageBytes } from '../../shared/kafka/dead-letter.js';
import { createSink, PRODUCE_REQUEST_MAX_RECORDS } from '../../shared/kafka/sink.js';
import { testKafka } from '../helpers/kafka.js';

const redis = testRedis();
const procs: Proc[] = [];
// Each test's processes end with it: left running to the file's end, they loaded the broker for the tests after.
afterEach(() => killAll(procs));
afterAll(() => {
  redis.disconnect();
});

/** A sequence-state.v1 output record, the sink's contract in these tests. */
const stateRecord = (i: number, session: string, tools: number) => ({
  schema_version: 1 as const,
  tenant_id: 'default',
  agent_id: 'default',
  session_id: session,
  event_id: `e${i}`,
  ts: i,
  active_step: null,
  sequence_index: i,
  expected: [],
  allowed_tools: Array.from({ length: tools }, (_, k) => `tool_${k}`),
  completed: false,
  violation: null,
});

const start = (env: Record<string, string>) => startReady(RECORDER, env, procs);

describe('consumer runner (real Kafka, real Redis, real processes)', () => {
  it('loses nothing when the consumer is SIGKILLed mid-batch and restarted (at-least-once)', async () => {
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      FIXTURE_DELAY_MS: '25',
      PAVER_BATCH_CHUNK: '40',
    });
    await createRecorderTopics(env);
    const N = 4000;
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      Array.from({ length: N }, (_, i) => ({ key: `s${i % 7}`, value: JSON.stringify(recorderEvent(i)) })),
    );
    const seenKey = `${env.REDIS_KEY_PREFIX}:seen`;

    const first = await start(env);
    await waitFor(async () => (await redis.scard(seenKey)) >= 600, 'first 600 events');
    first.child.kill('SIGKILL');
    expect(await first.exited).toBeNull();
    const seenBefore = await redis.smembers(seenKey);
    const beforeRestart = seenBefore.length;
    expect(beforeRestart).toBeLessThan(N);

    await start(env);
    await waitFor(async () => (await redis.scard(seenKey)) === N, `all ${N} events after restart`, 90_000);
    const byId = await redis.hgetall(`${env.REDIS_KEY_PREFIX}:deliveries`);
    expect(Object.keys(byId)).toHaveLength(N);
    // Committed progress survived the kill: of what the first process had handled, only the chunks in
    // flight were delivered again. (The second run may redeliver its own chunks too, when the killed
    // member's session expires and the group rebalances: at-least-once allows that, so it is not counted.)
    const redeliveredFromBefore = seenBefore.filter((id) => Number(byId[id]) > 1).length;
    expect(redeliveredFromBefore).toBeLessThan(beforeRestart);
  });

  it('dead-letters every kind of bad input with its reason while the good messages around it are processed', async () => {
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), PAVER_MAX_MESSAGE_BYTES: '2048' });
    await createRecorderTopics(env, 1);
    const bad: [string, string | Buffer][] = [
      ['undecodable', '{"type": "tool_call", not json'],
      ['invalid', JSON.stringify({ ...recorderEvent(1001), step: 'three' })],
      ['invalid', JSON.stringify({ type: 'tool_call', event_id: 'x', ts: 1 })],
      ['oversize', JSON.stringify({ ...recorderEvent(1002), args: { blob: 'x'.repeat(4000) } })],
      ['unknown_event_type', JSON.stringify({ ...recorderEvent(1003), type: 'tool_exploded' })],
      ['invalid', JSON.stringify([1, 2, 3])],
      ['registry_error', Buffer.from([0, 0, 0, 0, 7, 123, 125])],
    ];
    const msgs = [];
    for (let i = 0; i < 20; i++) {
      msgs.push({ key: 's', value: JSON.stringify(recorderEvent(i)) });
      const b = bad[i % bad.length];
      // The bad ones carry a trace context: their dead letters keep it, for whoever replays them.
      if (i < bad.length && b)
        msgs.push({
          key: 's',
          value: b[1],
          headers: { traceparent: `00-trace${i}-01`, 'paver-dlq-reason': 'x' },
        });
    }
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, msgs);
    const p = await start(env);

    await waitFor(
      async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 20,
      'the 20 good events',
    );
    const dl = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= bad.length);
    expect(dl).toHaveLength(bad.length);
    const bodies = dl.map(
      (m) =>
        JSON.parse(m.value!.toString()) as {
          reason: string;
          detail: string;
          source: { topic: string; offset: string };
          original_b64: string;
        },
    );
    expect(bodies.map((b) => b.reason).sort()).toEqual(bad.map(([r]) => r).sort());
    for (const [i, b] of bodies.entries()) {
      expect(b.source.topic).toBe(env.PAVER_TOPIC_TOOL_CALLS);
      expect(dl[i]!.headers['paver-dlq-reason']).toBe(b.reason);
      expect(dl[i]!.headers['paver-source-offset']).toBe(b.source.offset);
      expect(dl[i]!.headers.traceparent).toMatch(/^00-trace\d+-01$/);
      // Original bytes are kept for replay; the detail never quotes them.
      expect(b.original_b64.length).toBeGreaterThan(0);
      expect(b.detail).not.toContain('three');
    }
    // A chunk counts its dead letters once they are written and its processed events after that, and reports its
    // lag once committed: all after the effects seen above.
    const read = async () => parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    await waitFor(async () => {
      const m = await read();
      return (
        m.value('paver_dead_letters_total', { reason: 'invalid' }) >= 3 &&
        m.value('paver_dead_letters_total', { reason: 'oversize' }) >= 1 &&
        m.value('paver_events_consumed_total', { outcome: 'processed' }) >= 20 &&
        m.samples.some((s) => s.name === 'paver_consumer_lag' && s.labels.partition === '0' && s.value === 0)
      );
    }, 'the dead letters and processed events counted, no lag reported');
    const metrics = await read();
    expect(metrics.value('paver_dead_letters_total', { reason: 'invalid' })).toBe(3);
    expect(metrics.value('paver_dead_letters_total', { reason: 'oversize' })).toBe(1);
    expect(metrics.value('paver_events_consumed_total', { outcome: 'processed' })).toBe(20);
    expect(metrics.value('paver_consumer_lag', { partition: '0' })).toBe(0);
    expect(metrics.has('process_cpu_seconds_total')).toBe(true);
    expect(metrics.has('paver_batch_processing_seconds_bucket')).toBe(true);
  });

  it.each([
    ['originals beyond 256 KiB kept as a hash', {}],
    // Originals kept up to 10 MiB: the full record is over PAVER_MAX_OUTPUT_BYTES, the hash-only one goes instead.
    ['the full record over PAVER_MAX_OUTPUT_BYTES', { PAVER_DEAD_LETTER_MAX_ORIGINAL_BYTES: '10485760' }],
  ])(
    'dead-letters a message just under the broker limit and one over PAVER_MAX_MESSAGE_BYTES (%s); the partition flows on',
    async (_what, extra: Record<string, string>) => {
      const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), ...extra });
      // The input topic takes bigger messages than the broker default; the dead-letter topic keeps the default
      // limit (message.max.bytes = 1048588), which the old full-copy dead letters could not fit.
      await createTopics([
        { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1, config: { 'max.message.bytes': '4194304' } },
        { topic: env.PAVER_TOPIC_DEAD_LETTERS!, partitions: 1 },
      ]);
      const nearLimit = Buffer.from(
        JSON.stringify({ ...recorderEvent(5001), step: 'three', args: { blob: 'y'.repeat(1_040_000) } }),
      );
      const overMax = Buffer.from(
        JSON.stringify({ ...recorderEvent(5002), args: { blob: 'z'.repeat(1_500_000) } }),
      );
      expect(nearLimit.length).toBeLessThan(1_048_588 - 200);
      expect(overMax.length).toBeGreaterThan(1024 * 1024);
      const good = (from: number, n: number) =>
        Array.from({ length: n }, (_, i) => ({ key: 's', value: JSON.stringify(recorderEvent(from + i)) }));
      await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
        ...good(0, 10),
        { key: 's', value: nearLimit },
        ...good(10, 10),
        { key: 's', value: overMax },
        ...good(20, 10),
      ]);
      const p = await start(env);
      await waitFor(
        async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 30,
        'the 30 good events',
      );
      const dl = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 2);
      expect(dl).toHaveLength(2);
      const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
      const bodies = dl.map((m) => {
        expect(m.value!.length).toBeLessThan(64 * 1024);
        return JSON.parse(m.value!.toString()) as Record<string, unknown> & {
          source: { offset: string; topic: string };
        };
      });
      expect(
        bodies.map((b) => [b.reason, b.source.offset, b.original_size, b.original_b64, b.original_sha256]),
      ).toEqual([
        ['invalid', '10', nearLimit.length, null, sha(nearLimit)],
        ['oversize', '21', overMax.length, null, sha(overMax)],
      ]);
      // The partition flows on after them.
      await produce(env.PAVER_TOPIC_TOOL_CALLS!, good(30, 5));
      await waitFor(
        async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 35,
        'events after them',
      );
      const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
      expect(metrics.value('paver_dead_letters_total', { reason: 'invalid' })).toBe(1);
      expect(metrics.value('paver_dead_letters_total', { reason: 'oversize' })).toBe(1);
      expect(metrics.value('paver_consumer_crashes_total', { restart: 'true' })).toBe(0);
    },
  );

  it('dead letters the broker refuses together go one by one, each keeping its original bytes where it fits', async () => {
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g') });
    // A dead-letter topic whose limit is under the runner's request budget: three 60 KB dead letters (under
    // PAVER_DEAD_LETTER_MAX_ORIGINAL_BYTES) fit alone, not together.
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS!, partitions: 1, config: { 'max.message.bytes': '150000' } },
    ]);
    const bad = [1, 2, 3].map((i) =>
      Buffer.from(
        JSON.stringify({ ...recorderEvent(6000 + i), step: 'three', args: { blob: 'q'.repeat(45_000) } }),
      ),
    );
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      bad.map((value) => ({ key: 's', value })),
    );
    await start(env);
    const dl = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 3);
    const bodies = dl.map((m) => JSON.parse(m.value!.toString()) as { original_b64: string | null });
    expect(
      bodies.map((b) => (b.original_b64 === null ? null : Buffer.from(b.original_b64, 'base64'))),
    ).toEqual(bad);
  });

  it('holds dead letters to PAVER_MAX_OUTPUT_BYTES as the broker counts it: one at the limit keeps its original, one byte over goes hash-only from the start, and each is written once', async () => {
    const limit = 200_000;
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      PAVER_MAX_OUTPUT_BYTES: String(limit),
      // Makes the bad messages `oversize`, whose dead letter's detail is known to the byte.
      PAVER_MAX_MESSAGE_BYTES: '1024',
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS!, partitions: 1, config: { 'max.message.bytes': String(limit) } },
    ]);
    // Kept as base64, about 197 KB of the 200 KB.
    const value = Buffer.from('v'.repeat(148_000));
    const timestamp = 1_700_000_000_000;
    // The dead letter the runner builds for a message at `offset` with a `pad` header of `n` bytes (its
    // timestamps are 13 digits, whatever they are).
    const deadLetterBytes = (offset: string, n: number) =>
      messageBytes(
        buildDeadLetter(
          'recorder',
          {
            topic: env.PAVER_TOPIC_TOOL_CALLS!,
            partition: 0,
            offset,
            key: Buffer.from('s'),
            value,
            timestamp: String(timestamp),
            headers: { pad: 'p'.repeat(n) },
          },
          'oversize',
          `${value.length} bytes > PAVER_MAX_MESSAGE_BYTES`,
          { maxOriginalBytes: 256 * 1024, maxKeyBytes: 1024 },
          Date.now(),
        ),
      );
    // The header that makes the dead letter exactly the limit (its length's varint grows with it), well under
    // the 8 KiB of source headers a dead letter carries.
    let pad = limit - deadLetterBytes('0', 0);
    while (deadLetterBytes('0', pad) > limit) pad--;
    expect(pad).toBeGreaterThan(0);
    expect(pad).toBeLessThan(4096);
    expect(deadLetterBytes('0', pad)).toBe(limit);
    expect(deadLetterBytes('1', pad + 1)).toBe(limit + 1);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
      { key: 's', value, timestamp, headers: { pad: 'p'.repeat(pad) } },
      { key: 's', value, timestamp, headers: { pad: 'p'.repeat(pad + 1) } },
      { key: 's', value: JSON.stringify(recorderEvent(1)) },
    ]);
    const p = await start(env);
    await waitFor(async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 1, 'the good event');
    await waitFor(
      () => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'the batch committed',
    );
    // Before: the one over went out in full, the broker refused it, and the group went again one by one, the
    // first (already written) with it: three dead letters for two messages.
    const dl = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 2);
    const bodies = dl.map(
      (m) => JSON.parse(m.value!.toString()) as { source: { offset: string }; original_b64: string | null },
    );
    expect(bodies.map((b) => [b.source.offset, b.original_b64 !== null])).toEqual([
      ['0', true],
      ['1', false],
    ]);
    expect(dl[0]!.headers.pad).toHaveLength(pad);
    expect(dl[1]!.headers.pad).toBeUndefined();
    expect(messageBytes({ key: dl[0]!.key, value: dl[0]!.value, headers: dl[0]!.headers })).toBe(limit);
    const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    expect(metrics.value('paver_dead_letters_total', { reason: 'oversize' })).toBe(2);
  });

  it('times a failed batch (outcome failed) and delivers its records again once the dependency is back', async () => {
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      PAVER_RETRY_ATTEMPTS: '1',
      PAVER_RETRY_INITIAL_MS: '50',
      PAVER_RETRY_MAX_MS: '100',
    });
    await createRecorderTopics(env);
    await redis.set(`${env.REDIS_KEY_PREFIX}:fail`, '1');
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      Array.from({ length: 30 }, (_, i) => ({ key: `s${i % 7}`, value: JSON.stringify(recorderEvent(i)) })),
    );
    const p = await start(env);
    const metrics = async () => parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    await waitFor(
      async () => (await metrics()).value('paver_batch_processing_seconds_count', { outcome: 'failed' }) >= 1,
      'a failed batch timed',
    );
    expect(await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)).toBe(0);
    await redis.del(`${env.REDIS_KEY_PREFIX}:fail`);
    await waitFor(async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 30, 'all events');
    // A batch is timed when it ends, after its commit, which follows the writes just seen: wait for it.
    await waitFor(
      async () => (await metrics()).value('paver_batch_processing_seconds_count', { outcome: 'ok' }) > 0,
      'a whole batch timed',
    );
    expect(
      (await metrics()).value('paver_batch_processing_seconds_count', { outcome: 'ok' }),
    ).toBeGreaterThan(0);
    expect(p.child.exitCode).toBeNull();
  });

  it('commits past the transaction markers of a transactional topic: no lag left, nothing delivered twice', async () => {
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), PAVER_LAG_POLL_MS: '500' });
    await createRecorderTopics(env);
    // Upstream exactly-once writers (Kafka Streams, Connect, Flink) end every transaction with a control
    // record: the last offset of each partition is a marker no consumer is given.
    const tx = (from: number, n: number, commit: boolean) => ({
      commit,
      messages: Array.from({ length: n }, (_, i) => ({
        key: `s${(from + i) % 7}`,
        value: JSON.stringify(recorderEvent(from + i)),
      })),
    });
    await produceInTransactions(env.PAVER_TOPIC_TOOL_CALLS!, [
      tx(0, 120, true),
      tx(120, 30, false),
      tx(150, 60, true),
    ]);

    const p = await start(env);
    await waitFor(
      async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 180,
      'the committed events',
    );
    // Before: the group stayed one offset short of each partition's end (the marker), for good: lag 1 and an
    // oldest-unprocessed age growing without bound, and a table on such a topic never caught up.
    await waitFor(
      () => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'committed to the end',
      20_000,
    );
    const metrics = async () => parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    await waitFor(
      async () => {
        const m = await metrics();
        return [0, 1, 2].every(
          (i) =>
            m.value('paver_consumer_lag', { partition: String(i) }) === 0 &&
            m.value('paver_consumer_oldest_unprocessed_age_seconds', { partition: String(i) }) === 0,
        );
      },
      'no lag reported',
      20_000,
    );
    // A fetch holding nothing a consumer is given (an aborted transaction read once caught up) never reaches
    // the batch handler: it is committed past all the same.
    await produceInTransactions(env.PAVER_TOPIC_TOOL_CALLS!, [tx(210, 20, false)]);
    await waitFor(
      () => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'committed past the aborted transaction',
      20_000,
    );
    const deliveries = await redis.hgetall(`${env.REDIS_KEY_PREFIX}:deliveries`);
    expect(Object.keys(deliveries).sort()).toEqual(
      [
        ...Array.from({ length: 120 }, (_, i) => `e${i}`),
        ...Array.from({ length: 60 }, (_, i) => `e${150 + i}`),
      ].sort(),
    );
    expect(Object.values(deliveries).every((n) => n === '1')).toBe(true);
  });

  it('stops gracefully on SIGTERM: exit 0, offsets committed, nothing re-read after restart', async () => {
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g') });
    await createRecorderTopics(env);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      Array.from({ length: 300 }, (_, i) => ({ key: `s${i % 7}`, value: JSON.stringify(recorderEvent(i)) })),
    );
    const p = await start(env);
    await waitFor(async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 300, 'all events');
    p.child.kill('SIGTERM');
    expect(await p.exited, p.output().slice(-3000)).toBe(0);
    expect(p.output()).toContain('"msg":"stopped"');
    // A rebalance under load may redeliver a chunk before the stop (at-least-once); what the stop owes is
    // that nothing delivered before it is delivered again after the restart.
    const before = await redis.hgetall(`${env.REDIS_KEY_PREFIX}:deliveries`);
    expect(Object.keys(before)).toHaveLength(300);

    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [{ key: 's1', value: JSON.stringify(recorderEvent(300)) }]);
    const again = await start(env);
    await waitFor(async () => (await redis.scard(`${env.REDIS_KEY_PREFIX}:seen`)) === 301, 'the new event');
    // Every partition read to its end, so a re-read, if any, has happened by now.
    await waitFor(() => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!), 'caught up');
    again.child.kill('SIGTERM');
    expect(await again.exited, again.output().slice(-3000)).toBe(0);
    const after = await redis.hgetall(`${env.REDIS_KEY_PREFIX}:deliveries`);
    const reread = Object.keys(before).filter((id) => after[id] !== before[id]);
    expect(reread).toEqual([]);
    expect(after.e300).toBe('1');
  });

  it('publishes one batch of outputs bigger than the broker accepts per request in several requests, in order', async () => {
    const topic = unique('out');
    // One partition, so the order of every record is observable; the broker's own limit stays the default.
    await createTopics([{ topic, partitions: 1 }]);
    const sink = createSink(testKafka(), jsonCodec());
    await sink.connect();
    const N = 1500; // ≈ 3 MiB: three times what one request to this broker may carry
    const record = (i: number) => stateRecord(i, `s${i % 3}`, 200);
    try {
      await sink.send(
        topic,
        'sequence-state.v1',
        Array.from({ length: N }, (_, i) => ({ key: `s${i % 3}`, value: record(i) })),
      );
    } finally {
      await sink.disconnect();
    }
    const got = await consumeUntil(topic, (all) => all.length >= N);
    expect(got.map((m) => (JSON.parse(String(m.value)) as { event_id: string }).event_id)).toEqual(
      Array.from({ length: N }, (_, i) => `e${i}`),
    );
    // And an output that breaks its contract never leaves, whatever else is in the batch.
    const bad = createSink(testKafka(), jsonCodec());
    await bad.connect();
    try {
      await expect(
        bad.send(topic, 'sequence-state.v1', [
          { key: 's', value: record(1) },
          { key: 's', value: { ...record(2), sequence_index: -1 } },
        ]),
      ).rejects.toThrow(/output violates sequence-state.v1: sequence_index: /);
    } finally {
      await bad.disconnect();
    }
  });

  it("puts every key on the partition kafkajs's default partitioner picks, in order per key over several requests", async () => {
    const [viaSink, viaKafkajs] = [unique('sink'), unique('kafkajs')];
    await createTopics([
      { topic: viaSink, partitions: 5 },
      { topic: viaKafkajs, partitions: 5 },
    ]);
    // More records than one request carries, keys of several shapes (ASCII of every length mod 4, non-ASCII).
    const keys = Array.from({ length: 300 }, (_, k) =>
      k % 10 === 0 ? `sessión-${k}-é` : `s-${'x'.repeat(k % 4)}${k}`,
    );
    const N = PRODUCE_REQUEST_MAX_RECORDS * 2 + 500;
    const out = Array.from({ length: N }, (_, i) => ({
      key: keys[i % keys.length]!,
      value: stateRecord(i, keys[i % keys.length]!, 1),
    }));
    const sink = createSink(testKafka(), jsonCodec());
    await sink.connect();
    try {
      await sink.send(viaSink, 'sequence-state.v1', out);
    } finally {
      await sink.disconnect();
    }
    await produce(
      viaKafkajs,
      out.map((r) => ({ key: r.key, value: 'x' })),
    );
    const [a, b] = await Promise.all([
      consumeUntil(viaSink, (all) => all.length >= N),
      consumeUntil(viaKafkajs, (all) => all.length >= N),
    ]);
    const partitionOf = (got: typeof a) => {
      const m = new Map<string, Set<number>>();
      for (const r of got) m.set(r.key!, (m.get(r.key!) ?? new Set()).add(r.partition));
      return m;
    };
    const [pa, pb] = [partitionOf(a), partitionOf(b)];
    expect(pa.size).toBe(keys.length);
    for (const k of keys) {
      expect(pa.get(k)!.size).toBe(1);
      expect([...pa.get(k)!]).toEqual([...pb.get(k)!]);
    }
    expect(new Set(a.map((r) => r.partition)).size).toBe(5);
    // Per key, every record comes back, first in the order it was sent. kafkajs resends a whole request to a
    // broker that failed part of it (a partition between leaders, a timeout on a loaded machine), so a run of
    // a request's records may come again right after it: at-least-once, as the README says; never a record
    // missing, nor one first seen before an earlier one.
    const seqOf = (r: (typeof a)[number]) =>
      (JSON.parse(String(r.value)) as { sequence_index: number }).sequence_index;
    for (const k of keys) {
      const seq = [
        ...new Set(
          a
            .filter((r) => r.key === k)
            .sort((x, y) => Number(BigInt(x.offset) - BigInt(y.offset)))
            .map(seqOf),
        ),
      ];
      expect(seq).toEqual(out.flatMap((r, i) => (r.key === k ? [i] : [])));
    }
  });

  it('refuses bad configuration with one message naming every bad variable, exit 78', async () => {
    const p = await startProcess(['bin/paver.js', 'run', 'detector'], {
      PATH: process.env.PATH ?? '',
      REDIS_URL: 'http://nope',
      KAFKA_SASL_MECHANISM: 'gssapi',
      DETECTOR_LOOKBACK: 'many',
      LOG_LEVEL: 'loud',
    });
    expect(await p.exited).toBe(78);
    const out = p.output();
    for (const v of [
      'KAFKA_BROKERS: is required',
      'REDIS_URL',
      'KAFKA_SASL_MECHANISM',
      'DETECTOR_LOOKBACK',
      'LOG_LEVEL',
    ])
      expect(out).toContain(v);
  });
});

describe('consumer runner: a chunk whose effect outlasts the session timeout', () => {
  it('keeps its group membership while the handler works (no eviction, no redelivery loop)', async () => {
    // A handler that never heartbeats itself (a slow model call per request, a slow Redis) and takes 1.5 session
    // timeouts: the runner must keep the member alive, or the broker evicts it, the commit fails, the chunk is
    // read again and takes as long again, for good.
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      KAFKA_SESSION_TIMEOUT_MS: '6000',
      FIXTURE_DELAY_MS: '9000',
    });
    await createRecorderTopics(env, 1);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      Array.from({ length: 20 }, (_, i) => ({ key: 's', value: JSON.stringify(recorderEvent(i)) })),
    );
    const p = await start(env);
    await explained(
      p,
      waitFor(
        () => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
        'the slow chunk committed',
        45_000,
      ),
    );
    const deliveries = await redis.hgetall(`${env.REDIS_KEY_PREFIX}:deliveries`);
    expect(Object.keys(deliveries)).toHaveLength(20);
    expect(Object.values(deliveries).every((n) => n === '1')).toBe(true);
    const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    // One join, no rebalance forced by an eviction.
    expect(metrics.value('paver_consumer_rebalances_total')).toBe(1);
  });
});
