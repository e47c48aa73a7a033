import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { toolCallsEventV1, type ToolCallsEvent } from '../../../../schemas/index.js';
import {
  consumeUntil,
  createTopics,
  groupCaughtUp,
  produce,
  testKafka,
  testRedis,
  unique,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis, type OwnRedis } from '../../../../test/helpers/own-redis.js';
import {
  PAVER_BIN,
  getJson,
  isReady,
  serviceEnv,
  startProcess,
  type Proc,
  stopPromptly,
} from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { Registry } from 'prom-client';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { createIngestApply, createIngestMetrics } from '../../src/adapters/handler.js';
import { ingestGlobalKeys, RedisTraceStore } from '../../src/adapters/trace-store.js';
import { DEFAULT_MAP_OPTIONS } from '../../src/core/map.js';
import { decodeRecorded, otelRecorder, toJson, toProto } from '../helpers/otel.js';

/*
 * Redis loss, survived. A task's tool spans wait in Redis for its agent span, and the message that brought them
 * is committed. Redis then loses its state (FLUSHALL; or a redis-server restarted empty while ingest was down).
 * When the agent span comes, the task must still be published whole: ingest sees the epoch marker gone and
 * reads the partition's recent messages again to rebuild what waited, publishing nothing twice. Before, the
 * task was lost silently: an agent span whose tool spans are gone completes with no event at all (one whose
 * chunk brought some of them published only those).
 */

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  stopOwnRedis();
});

const metric = async (p: Proc, name: string, labels?: Record<string, string>) =>
  parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name, labels) ?? 0;

/**
 * `shared`: another deployment's redis-server and key prefix, for a second deployment on a topic of its own;
 * `otlpConfig`: the OTLP topic's configuration.
 */
async function setUp(
  name: string,
  o: {
    shared?: { redisServer: OwnRedis; prefix: string };
    otlpConfig?: Record<string, string>;
    partitions?: number;
    env?: Record<string, string>;
  } = {},
) {
  const { shared } = o;
  const redisServer = shared?.redisServer ?? (await ownRedis());
  const env = serviceEnv({
    INGEST_GROUP_ID: `${name}-${Date.now()}`,
    REDIS_URL: redisServer.url,
    // One message per chunk: the tool spans are stored and committed before the agent span is read.
    PAVER_BATCH_CHUNK: '1',
    ...(shared ? { REDIS_KEY_PREFIX: shared.prefix } : {}),
    ...o.env,
  });
  env.INGEST_OTLP_TOPIC = `${env.PAVER_TOPIC_TOOL_CALLS}.otlp`;
  await createTopics([
    {
      topic: env.INGEST_OTLP_TOPIC,
      partitions: o.partitions ?? 1,
      ...(o.otlpConfig ? { config: o.otlpConfig } : {}),
    },
    { topic: env.PAVER_TOPIC_TOOL_CALLS! },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
  ]);
  const rec = otelRecorder();
  const isAgent = (s: { name: string }) => s.name.startsWith('invoke_agent');
  const waiting = rec.agent({
    name: 'Support',
    conversationId: 'conv-waiting',
    tools: [{ name: 'get_user', args: { user_id: 'u1' } }, { name: 'get_order' }],
  });
  const whole = rec.agent({ name: 'Support', conversationId: 'conv-whole', tools: [{ name: 'lookup' }] });
  const key = (spans: typeof waiting) => spans[0]!.spanContext().traceId;
  const start = async () => {
    const p = await startProcess([PAVER_BIN, 'run', 'ingest'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'ingest /readyz').catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output()}`);
    });
    return p;
  };
  const events = async (until: (all: string[]) => boolean) =>
    (
      await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => until(all.map((m) => m.value!.toString())))
    ).map((m) => toolCallsEventV1.parse(JSON.parse(m.value!.toString())) as ToolCallsEvent);
  const completed = (session: string) => (all: string[]) =>
    all.some((v) => v.includes('"task_completed"') && v.includes(session));
  /** The whole task published, the waiting task's two tool spans in Redis, and their messages committed. */
  const settled = async (p: Proc) => {
    await events(completed('conv-whole'));
    await waitFor(
      async () => (await metric(p, 'paver_ingest_spans_total', { outcome: 'pending' })) === 2,
      'the two tool spans waiting in Redis',
    );
    await waitFor(() => groupCaughtUp(env.INGEST_GROUP_ID!, env.INGEST_OTLP_TOPIC!), 'both committed');
  };
  return {
    redisServer,
    env,
    start,
    events,
    waiting,
    whole,
    isAgent,
    key,
    /** The waiting task's tool spans, then a whole task: both handled and committed. */
    before: async (p: Proc) => {
      await produce(env.INGEST_OTLP_TOPIC!, [
        { key: key(waiting), value: toProto(waiting.filter((s) => !isAgent(s))) },
        { key: key(whole), value: toJson(whole) },
      ]);
      await settled(p);
    },
    settled,
    /** The waiting task's agent span, and the tool-calls topic once it is handled. */
    after: async (o: { timestamp?: number } = {}) => {
      await produce(env.INGEST_OTLP_TOPIC!, [
        { key: key(waiting), value: toJson(waiting.filter(isAgent)), ...o },
      ]);
      // Handled and committed means published: everything the topic will get for it is there now.
      await waitFor(() => groupCaughtUp(env.INGEST_GROUP_ID!, env.INGEST_OTLP_TOPIC!), 'agent span handled');
      const admin = testKafka().admin();
      await admin.connect();
      const offsets = await admin.fetchTopicOffsets(env.PAVER_TOPIC_TOOL_CALLS!);
      await admin.disconnect();
      const total = offsets.reduce((a, o) => a + Number(o.high) - Number(o.low), 0);
      return events((all) => all.length >= total);
    },
  };
}

/** The waiting task whole (its tool calls, then its completion), and the whole task published once. */
function expectWhole(events: ToolCallsEvent[]) {
  // In order within a session (its key); sessions may sit on different partitions of the topic.
  const of = (session: string) =>
    events.filter((e) => e.session_id === session).map((e) => (e.type === 'tool_call' ? e.tool : e.type));
  expect(of('conv-whole')).toEqual(['lookup', 'task_completed']);
  expect(of('conv-waiting')).toEqual(['get_user', 'get_order', 'task_completed']);
  expect(events).toHaveLength(5);
  expect(new Set(events.map((e) => e.event_id)).size).toBe(events.length);
}

describe('ingest: Redis state lost (real Kafka, a redis-server of its own)', () => {
  it('rebuilds the spans that waited when Redis is flushed under a running service', async () => {
    const t = await setUp('ingest-flush');
    const p = await t.start();
    await t.before(p);

    const r = new Redis(t.redisServer.url);
    await r.flushall();
    r.disconnect();
    const events = await t.after();
    expectWhole(events);
    expect(await metric(p, 'paver_ingest_rebuilds_total', { outcome: 'rebuilt' })).toBeGreaterThanOrEqual(1);
    expect(await metric(p, 'paver_ingest_rebuild_messages_total')).toBe(2);
    expect(p.output()).toContain('replaying its pending spans from Kafka');
    // The broker's default retention (7 days) keeps more than INGEST_PENDING_TTL_MS: nothing to say.
    expect(p.output()).not.toContain('retention.ms');
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('rebuilds them for a consumer lagging by more than INGEST_PENDING_TTL_MS (records stamped long before now)', async () => {
    // A backlog read hours late: the spans wait in Redis a TTL after they were handled, though stamped earlier.
    const t = await setUp('ingest-lag', { env: { INGEST_PENDING_TTL_MS: '600000' } });
    const p = await t.start();
    const stamped = Date.now() - 3_600_000;
    const { waiting, whole, isAgent, key } = t;
    await produce(t.env.INGEST_OTLP_TOPIC!, [
      { key: key(waiting), value: toProto(waiting.filter((s) => !isAgent(s))), timestamp: stamped },
      { key: key(whole), value: toJson(whole), timestamp: stamped + 1_000 },
    ]);
    await t.settled(p);
    const r = new Redis(t.redisServer.url);
    await r.flushall();
    r.disconnect();
    expectWhole(await t.after({ timestamp: stamped + 2_000 }));
    expect(await metric(p, 'paver_ingest_rebuild_messages_total')).toBe(2);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('a chunk whose first record carries no time (stamped 0) is handled, the TTL before now replayed', async () => {
    const t = await setUp('ingest-unstamped', { env: { INGEST_PENDING_TTL_MS: '600000' } });
    const p = await t.start();
    const { waiting, whole, isAgent, key } = t;
    // A record stamped long before the TTL, then the waiting task's tool spans, stamped now.
    await produce(t.env.INGEST_OTLP_TOPIC!, [
      { key: key(whole), value: toJson(whole), timestamp: Date.now() - 3 * 3_600_000 },
      { key: key(waiting), value: toProto(waiting.filter((s) => !isAgent(s))) },
    ]);
    await t.settled(p);
    const r = new Redis(t.redisServer.url);
    await r.flushall();
    r.disconnect();
    // A producer that stamps 0 (or a record of the old format, -1): its time says nothing of the stream's. Asked
    // for the offset at 0 - TTL, the broker answers UNSUPPORTED_VERSION, and the chunk was retried for ever.
    expectWhole(await t.after({ timestamp: 0 }));
    // The TTL before now: the tool spans' record alone, not the one stamped hours back (nor a week of retention).
    expect(await metric(p, 'paver_ingest_rebuild_messages_total')).toBe(1);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('rebuilds them when ingest was killed and its redis-server came back empty', async () => {
    const t = await setUp('ingest-restart');
    const first = await t.start();
    await t.before(first);
    first.child.kill('SIGKILL');
    await first.exited;
    // Redis restarted without persistence: empty, on the same port.
    t.redisServer.child.kill('SIGKILL');
    await new Promise((r) => t.redisServer.child.once('exit', r));
    await ownRedis(t.redisServer.port);

    const second = await t.start();
    expectWhole(await t.after());
    expect(await metric(second, 'paver_ingest_rebuild_messages_total')).toBe(2);
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
  });

  it('honours a SIGTERM during a long rebuild: exits 0 at once, commits nothing of it, and the next start rebuilds', async () => {
    // Before, the replay ran on under the stop: the process left only once it was over (or, when it outlasted
    // PAVER_SHUTDOWN_TIMEOUT_MS, with exit 1), and its chunk was committed by a process told to stop.
    const t = await setUp('ingest-stop', {
      env: {
        // One small record batch per fetch: the replay of the backlog takes many fetches, and a while.
        KAFKA_MAX_BYTES_PER_PARTITION: '1024',
        PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
      },
    });
    const topic = t.env.INGEST_OTLP_TOPIC!;
    const group = t.env.INGEST_GROUP_ID!;
    const first = await t.start();
    await t.before(first);
    first.child.kill('SIGTERM');
    expect(await first.exited).toBe(0);

    // A long history after them, already handled as far as the group knows (committed past it): every later
    // rebuild reads it again, publishing nothing of it.
    const rec = otelRecorder();
    const BACKLOG = 4000;
    const backlog = Array.from({ length: BACKLOG }, (_, i) =>
      toJson(rec.agent({ name: 'Bulk', conversationId: `bulk-${i}`, tools: [{ name: 'bulk_tool' }] })),
    );
    const producer = testKafka().producer();
    await producer.connect();
    for (let i = 0; i < backlog.length; i += 5)
      await producer.send({ topic, acks: -1, messages: backlog.slice(i, i + 5).map((value) => ({ value })) });
    await producer.disconnect();
    const admin = testKafka().admin();
    await admin.connect();
    const [end] = await admin.fetchTopicOffsets(topic);
    await admin.setOffsets({ groupId: group, topic, partitions: [{ partition: 0, offset: end!.high }] });
    const committed = async () =>
      BigInt((await admin.fetchOffsets({ groupId: group, topics: [topic] }))[0]!.partitions[0]!.offset);

    const second = await t.start();
    const r = new Redis(t.redisServer.url);
    await r.flushall();
    r.disconnect();
    // The waiting task's agent span: its chunk finds the state gone and replays the whole history first.
    await produce(topic, [{ key: t.key(t.waiting), value: toJson(t.waiting.filter(t.isAgent)) }]);
    await waitFor(
      async () => (await metric(second, 'paver_ingest_rebuilding')) === 1,
      'the rebuild under way',
    );
    // Far below PAVER_SHUTDOWN_TIMEOUT_MS: the stop did not wait for its work.
    const code = await stopPromptly(second);
    expect(code, second.output().slice(-3000)).toBe(0);
    // The chunk that started the rebuild was given back, and the partition was not marked rebuilt.
    expect(await committed()).toBe(BigInt(end!.high));
    expect(second.output()).not.toContain('ingest partition state rebuilt from Kafka');
    expect(second.output()).toContain('ingest state rebuild stopped');

    const third = await t.start();
    await waitFor(() => groupCaughtUp(group, topic), 'the agent span handled after the restart');
    expect(await committed()).toBe(BigInt(end!.high) + 1n);
    const offsets = await admin.fetchTopicOffsets(t.env.PAVER_TOPIC_TOOL_CALLS!);
    await admin.disconnect();
    const total = offsets.reduce((a, o) => a + Number(o.high) - Number(o.low), 0);
    // The same tasks as with no stop: the waiting one whole, nothing twice, nothing of the history published.
    expectWhole(await t.events((all) => all.length >= total));
    expect(await metric(third, 'paver_ingest_rebuilds_total', { outcome: 'rebuilt' })).toBeGreaterThanOrEqual(
      1,
    );
    expect(await metric(third, 'paver_ingest_rebuild_messages_total')).toBe(BACKLOG + 2);
    third.child.kill('SIGTERM');
    expect(await third.exited).toBe(0);
  }, 240_000);

  it('rebuilds each deployment on its own topic when two share a Redis and its key prefix', async () => {
    // Two Collectors, two OTLP topics, one ingest deployment each, one Redis with the default prefix: both
    // partitions are number 0. Before, the first deployment to rebuild marked "partition 0" rebuilt in the new
    // epoch, and the second one trusted that mark: its waiting task was published without its tool calls.
    const a = await setUp('ingest-two-a');
    const b = await setUp('ingest-two-b', {
      shared: { redisServer: a.redisServer, prefix: a.env.REDIS_KEY_PREFIX! },
    });
    const pa = await a.start();
    const pb = await b.start();
    await a.before(pa);
    await b.before(pb);

    const r = new Redis(a.redisServer.url);
    await r.flushall();
    r.disconnect();
    expectWhole(await a.after());
    expectWhole(await b.after());
    expect(await metric(pb, 'paver_ingest_rebuild_messages_total')).toBe(2);
    for (const p of [pa, pb]) {
      p.child.kill('SIGTERM');
      expect(await p.exited).toBe(0);
    }
  });

  it('rebuilds each partition when its own next chunk comes, after another partition noticed the loss', async () => {
    // Partition 0 notices the loss and starts the new epoch; partition 1, quiet meanwhile and trusted under the old
    // one, must not take the new epoch for its own: its task comes later and must still be whole.
    const t = await setUp('ingest-partitions', { partitions: 2 });
    const rec = otelRecorder();
    const isAgent = (s: { name: string }) => s.name.startsWith('invoke_agent');
    const x = rec.agent({ name: 'Support', conversationId: 'conv-p0', tools: [{ name: 'on_p0' }] });
    const y = rec.agent({ name: 'Support', conversationId: 'conv-p1', tools: [{ name: 'on_p1' }] });
    const topic = t.env.INGEST_OTLP_TOPIC!;
    const caughtUp = () => waitFor(() => groupCaughtUp(t.env.INGEST_GROUP_ID!, topic), 'caught up');
    const p = await t.start();
    await produce(topic, [
      { partition: 0, value: toProto(x.filter((s) => !isAgent(s))) },
      { partition: 1, value: toProto(y.filter((s) => !isAgent(s))) },
    ]);
    await waitFor(
      async () => (await metric(p, 'paver_ingest_spans_total', { outcome: 'pending' })) === 2,
      'both tool spans waiting in Redis',
    );
    await caughtUp();

    const r = new Redis(t.redisServer.url);
    await r.flushall();
    r.disconnect();
    await produce(topic, [{ partition: 0, value: toJson(x.filter(isAgent)) }]);
    await caughtUp();
    await produce(topic, [{ partition: 1, value: toJson(y.filter(isAgent)) }]);
    await caughtUp();
    // Handled and committed means published: all the topic will get is there now.
    const admin = testKafka().admin();
    await admin.connect();
    const offsets = await admin.fetchTopicOffsets(t.env.PAVER_TOPIC_TOOL_CALLS!);
    await admin.disconnect();
    const total = offsets.reduce((a, o) => a + Number(o.high) - Number(o.low), 0);
    const events = await t.events((all) => all.length >= total);
    const of = (session: string) =>
      events.filter((e) => e.session_id === session).map((e) => (e.type === 'tool_call' ? e.tool : e.type));
    expect(of('conv-p0')).toEqual(['on_p0', 'task_completed']);
    expect(of('conv-p1')).toEqual(['on_p1', 'task_completed']);
    // One message replayed on each partition.
    expect(await metric(p, 'paver_ingest_rebuild_messages_total')).toBe(2);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('warns at start when the OTLP topic keeps less than INGEST_PENDING_TTL_MS, which a rebuild reads again', async () => {
    // A rebuild after a Redis loss reads the last INGEST_PENDING_TTL_MS (6 h) of the topic; one that keeps an hour
    // gives back only that hour. Before, nothing said so until a task came out without its tool calls.
    const t = await setUp('ingest-retention', { otlpConfig: { 'retention.ms': '3600000' } });
    const p = await t.start();
    await waitFor(() => p.output().includes('retention.ms'), 'the retention warning');
    const line = p
      .output()
      .split('\n')
      .find((l) => l.includes('retention.ms'));
    expect(JSON.parse(line!)).toMatchObject({
      level: 40, // warn
      topic: t.env.INGEST_OTLP_TOPIC,
      retentionMs: 3600000,
      pendingTtlMs: 21600000,
    });
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('publishes and writes nothing from a chunk whose reads met the loss (the marker is no longer the one seen)', async () => {
    const redis = testRedis();
    const prefix = unique('ingest');
    const sent: unknown[] = [];
    const sink = { send: async (_t: string, _c: string, records: unknown[]) => void sent.push(...records) };
    const apply = createIngestApply({
      store: new RedisTraceStore(redis, prefix, 3_600_000),
      sink: sink as unknown as Sink,
      topic: 'tool-calls',
      opts: DEFAULT_MAP_OPTIONS,
      metrics: createIngestMetrics(new Registry()),
    });
    const spans = decodeRecorded(otelRecorder().agent({ name: 'A', tools: [{ name: 'one' }] }));
    const { epoch } = ingestGlobalKeys(prefix);
    // The marker as the service saw it, and the marker now: another epoch began in between.
    await redis.set(epoch, 'epoch-now');
    const r = await apply([spans], { publish: true, marker: { key: epoch, value: 'epoch-seen' } });
    expect(r.lost).toBe(true);
    expect(sent).toEqual([]);
    expect(await redis.keys(`${prefix}:ingest:trace:*`)).toEqual([]);
    // The same chunk under the marker as it is: published.
    expect((await apply([spans], { publish: true, marker: { key: epoch, value: 'epoch-now' } })).lost).toBe(
      false,
    );
    expect(sent).toHaveLength(2);
    await redis.quit();
  });
});
