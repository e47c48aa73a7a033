import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink, type Sink } from '../../../../shared/kafka/sink.js';
import { silentLogger } from '../../../../shared/log.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import {
  createTopics,
  produce,
  testKafka,
  testRedis,
  unique,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import { getJson, killAll, stopPromptly, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { readRulesLog } from '../../src/adapters/kafka/rules-log.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { learnKey, readScope, RedisLearnStore } from '../../src/adapters/redis/learn-store.js';
import { leaseKey, ScopeLeases } from '../../src/adapters/redis/scope-lease.js';
import { restoreRules } from '../../src/adapters/rules-snapshot.js';
import { scopeRegistryKey, ScopeRetirement } from '../../src/adapters/scope-retire.js';
import { applyEvent, scopeId } from '../../src/core/learn/engine.js';
import { fixtureEvents } from '../learn-streams.js';
import { learnedServiceEnv, LOW_BAR, startAutoseq } from './predict-compare.js';
import { ruleCopier } from './rule-copies.js';

const events = fixtureEvents();
/** The fixture's events as another agent's (a second scope); `again`: as new tasks of it, with new ids. */
const asAgent = (agent: string, again = ''): ToolCallsEvent[] =>
  events.map((e) => ({
    ...e,
    agent_id: agent,
    event_id: e.event_id + again,
    ...(e.task_id === undefined ? {} : { task_id: e.task_id + again }),
  }));

// Short lifetimes so that real time runs them out: Redis's PTTL is the sweep's clock, and it cannot be faked.
const TTL = 1500;
const GRACE = 10_000;

describe('idle scopes retired from Redis and from the rules topic (real Kafka and Redis)', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });

  /** A prefix, its rules topic, a copier registering what it copies, and the sweep, wired as the service does. */
  async function setup(opts: { sink?: Sink } = {}) {
    const prefix = unique('paver-test');
    const topic = unique('autoseq-rules');
    await createTopics([{ topic, partitions: 2, compacted: true }]);
    await sink.connect();
    const metrics = createAutoseqMetrics(new Registry(), () => 0);
    const copier: { snapshots?: ReturnType<typeof ruleCopier>['snapshots'] } = {};
    const retirement = new ScopeRetirement({
      redis,
      prefix,
      sink: opts.sink ?? sink,
      topic,
      leaseMs: 10_000,
      graceMs: GRACE,
      log: silentLogger(),
      paused: () => false,
      onRetired: (outcome, n) => metrics.scopesRetired.inc({ outcome }, n),
      recopy: (written) => copier.snapshots!.mark(written),
    });
    const { snapshots } = ruleCopier(redis, prefix, sink, topic, (s) => retirement.register(s));
    copier.snapshots = snapshots;
    const replay = {
      kafka: testKafka(),
      topic,
      groupPrefix: unique('g'),
      sessionTimeoutMs: 10_000,
      maxBytesPerPartition: 1024 * 1024,
    };
    /** One batch learned, saved with the TTL and its grace (`ttlMs`), and copied, as the service does. */
    const learn = async (batch: ToolCallsEvent[], ttlMs = TTL + GRACE) => {
      const store = await RedisLearnStore.load(
        redis,
        prefix,
        60_000,
        LOW_BAR,
        batch,
        { ttlMs: 10_000 },
        undefined,
        undefined,
        ttlMs,
      );
      for (const e of batch) applyEvent(store, e, LOW_BAR);
      await store.save();
      snapshots.mark(store.written());
      await snapshots.flush();
    };
    /** The scopes the topic holds now (tombstoned records left out, as a restore reads it). */
    const inTopic = async () =>
      (await readRulesLog({ ...replay, groupPrefix: unique('g') }, prefix)).scopes
        .map((s) => `${s.agent}:${s.ctxs.size}`)
        .sort();
    const registered = async () => (await redis.smembers(scopeRegistryKey(prefix))).sort();
    const retired = async (outcome: string) =>
      (await metrics.scopesRetired.get()).values.find((v) => v.labels.outcome === outcome)?.value ?? 0;
    return { prefix, topic, retirement, snapshots, replay, learn, inTopic, registered, retired };
  }

  it('retires a scope idle for the TTL: its records tombstoned, its state deleted; a scope idle for less is kept', async () => {
    const t = await setup();
    await t.learn(asAgent('idle'));
    await t.learn(asAgent('busy'), 3_600_000);
    expect(await t.registered()).toEqual([
      JSON.stringify(['default', 'busy']),
      JSON.stringify(['default', 'idle']),
    ]);
    const before = await t.inTopic();
    expect(before).toHaveLength(2);

    await waitFor(async () => (await t.retirement.sweep()).retired === 1, 'the idle scope retired', 30_000);
    expect(await redis.exists(learnKey(t.prefix, 'default', 'idle'))).toBe(0);
    expect(await t.registered()).toEqual([JSON.stringify(['default', 'busy'])]);
    expect(await t.inTopic()).toEqual(before.filter((s) => s.startsWith('busy:')));
    expect(await readScope(redis, t.prefix, 'default', 'busy')).not.toBeNull();
    expect(await t.retired('retired')).toBe(1);

    // A restore after a Redis loss brings back the busy scope only.
    await redis.del(learnKey(t.prefix, 'default', 'busy'));
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    expect(await restoreRules(redis, t.prefix, flag, t.replay)).toMatchObject({ scopes: 1, restored: 1 });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'idle'))).toBe(0);
    await redis.del(learnKey(t.prefix, 'default', 'busy'));
  });

  it('a scope that comes back after its retirement is registered and copied again', async () => {
    const t = await setup();
    await t.learn(asAgent('a'));
    const first = await t.inTopic();
    await waitFor(async () => (await t.retirement.sweep()).retired === 1, 'the idle scope retired', 30_000);
    expect(await t.inTopic()).toEqual([]);
    await t.learn(asAgent('a', ':again'));
    expect(await t.registered()).toEqual([JSON.stringify(['default', 'a'])]);
    expect(await t.inTopic()).toEqual(first);
    await waitFor(async () => (await t.retirement.sweep()).retired === 1, 'retired again', 30_000);
    expect(await t.inTopic()).toEqual([]);
  });

  it('leaves a scope whose lease a batch holds, and drops from the registry one Redis expired first', async () => {
    const t = await setup();
    await t.learn(asAgent('held'));
    const before = await t.inTopic();
    await t.learn(asAgent('expired'), 1000);
    await waitFor(
      async () => (await redis.pttl(learnKey(t.prefix, 'default', 'held'))) <= GRACE,
      'the scope idle for the TTL',
      30_000,
    );
    const batch = new ScopeLeases(redis, t.prefix, { ttlMs: 10_000 });
    await batch.acquire([{ id: scopeId('default', 'held'), tenant: 'default', agent: 'held' }]);
    await waitFor(async () => (await redis.exists(learnKey(t.prefix, 'default', 'expired'))) === 0, 'expiry');
    // Held: a batch is learning in it, so it is not idle whatever its TTL says.
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 1 });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'held'))).toBe(1);
    expect((await t.inTopic()).filter((s) => s.startsWith('held:'))).toEqual(before);
    expect(await t.registered()).toEqual([JSON.stringify(['default', 'held'])]);
    expect(await t.retired('gone')).toBe(1);
    await batch.release();
    expect(await t.retirement.sweep()).toEqual({ retired: 1, gone: 0 });
    expect(await t.registered()).toEqual([]);
  });

  it('keeps the state, and copies its contexts again, when the lease is lost between the tombstones and the delete', async () => {
    const inner = createSink(testKafka(), jsonCodec());
    await inner.connect();
    let steal: string | null = null;
    // The real sink; after the tombstones went out, another holder takes the lease (as after a stall past it).
    const thief: Sink = {
      ...inner,
      sendRaw: async (topic, records) => {
        await inner.sendRaw(topic, records);
        if (steal) await redis.set(steal, 'another-batch');
      },
    };
    try {
      const t = await setup({ sink: thief });
      await t.learn(asAgent('s'));
      const before = await t.inTopic();
      steal = leaseKey(t.prefix, 'default', 's');
      await waitFor(
        async () => (await redis.pttl(learnKey(t.prefix, 'default', 's'))) <= GRACE,
        'the scope idle for the TTL',
        30_000,
      );
      expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0 });
      expect(await redis.exists(learnKey(t.prefix, 'default', 's'))).toBe(1);
      expect(await t.inTopic()).toEqual([]);
      // The other holder is done: the contexts the tombstones took are copied again from the state kept.
      await redis.del(steal);
      steal = null;
      expect(t.snapshots.pending()).toBeGreaterThan(0);
      await t.snapshots.flush();
      expect(await t.inTopic()).toEqual(before);
    } finally {
      await inner.disconnect();
    }
  });

  it('a restore tombstones the records of the scopes it leaves out as expired, unless they came back', async () => {
    const t = await setup();
    await t.learn(asAgent('old'), 3_600_000);
    await t.learn(asAgent('back'), 3_600_000);
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    // `old` was lost with Redis; `back` has state again. The restore runs a day later: both copies are expired.
    await redis.del(learnKey(t.prefix, 'default', 'old'));
    const r = await restoreRules(
      redis,
      t.prefix,
      flag,
      t.replay,
      () => true,
      TTL,
      () => Date.now() + 86_400_000,
      {
        retirement: t.retirement,
        graceMs: GRACE,
      },
    );
    expect(r).toMatchObject({ scopes: 2, restored: 0, expired: 2, tombstoned: 1 });
    expect((await t.inTopic()).map((s) => s.split(':')[0])).toEqual(['back']);
    expect(await t.retired('expired_at_restore')).toBe(1);

    // Restored ones are registered for the sweep, with the grace past what was left of their lifetime.
    await redis.del(learnKey(t.prefix, 'default', 'back'));
    await redis.del(scopeRegistryKey(t.prefix));
    const again = await restoreRules(redis, t.prefix, flag, t.replay, () => true, 3_600_000, Date.now, {
      retirement: t.retirement,
      graceMs: GRACE,
    });
    expect(again).toMatchObject({ restored: 1, tombstoned: 0 });
    expect(await t.registered()).toEqual([JSON.stringify(['default', 'back'])]);
    const left = await redis.pttl(learnKey(t.prefix, 'default', 'back'));
    expect(left).toBeGreaterThan(3_600_000 - 120_000);
    expect(left).toBeLessThanOrEqual(3_600_000 + GRACE);
    await redis.del(learnKey(t.prefix, 'default', 'back'));
  });
});

describe('paver run autoseq retires an idle scope (real Kafka and Redis)', () => {
  const redis = testRedis();
  const procs: Proc[] = [];
  afterAll(async () => {
    await killAll(procs);
    await redis.quit();
  });

  it('registers the scope it copies, retires it once idle for AUTOSEQ_LEARN_SCOPE_TTL_MS, and stops promptly', async () => {
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-retire', LOW_BAR)),
      AUTOSEQ_RULES_SNAPSHOT_MS: '200',
      // The least the service takes: sweeps every 6 s, a grace of 18 s.
      AUTOSEQ_LEARN_SCOPE_TTL_MS: '60000',
    };
    const prefix = env.REDIS_KEY_PREFIX!;
    const key = learnKey(prefix, 'default', 'default');
    const p = await startAutoseq(env, procs);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      events.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
    );
    await waitFor(
      async () =>
        (await redis.sismember(scopeRegistryKey(prefix), JSON.stringify(['default', 'default']))) === 1,
      'the scope registered by its first copy',
    );
    const left = await redis.pttl(key);
    expect(left).toBeGreaterThan(60_000);
    expect(left).toBeLessThanOrEqual(78_000);
    const replay = {
      kafka: testKafka(),
      topic: env.AUTOSEQ_RULES_TOPIC!,
      sessionTimeoutMs: 10_000,
      maxBytesPerPartition: 1024 * 1024,
    };
    const inTopic = async () => (await readRulesLog({ ...replay, groupPrefix: unique('g') }, prefix)).scopes;
    expect(await inTopic()).toHaveLength(1);

    await waitFor(async () => (await redis.exists(key)) === 0, 'the idle scope retired', 150_000);
    const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    // Retired by the sweep, not dropped by Redis's expiry at the end of the grace.
    expect(metrics.value('paver_autoseq_scopes_retired_total', { outcome: 'retired' })).toBe(1);
    expect(await redis.scard(scopeRegistryKey(prefix))).toBe(0);
    expect(await inTopic()).toEqual([]);
    expect(await stopPromptly(p)).toBe(0);
  });
});
