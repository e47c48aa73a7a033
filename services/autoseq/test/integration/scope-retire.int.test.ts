import type { Redis } from 'ioredis';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { readLatest } from '../../../../shared/kafka/replay.js';
import { messageBytes } from '../../../../shared/kafka/dead-letter.js';
import { createSink, type Sink } from '../../../../shared/kafka/sink.js';
import { silentLogger } from '../../../../shared/log.js';
import { createEpoch, restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { createStateGuard, whileGoingOn } from '../../../../shared/redis/rebuild.js';
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
import {
  contextRecordKey,
  contextRecordValue,
  forgetMarkerKey,
  readRulesLog,
  scopeRecordKey,
  scopeRecordValue,
} from '../../src/adapters/kafka/rules-log.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { forgetsKey, learnKey, readScope } from '../../src/adapters/redis/learn-store.js';
import { leaseKey, ScopeLeases, wantKey } from '../../src/adapters/redis/scope-lease.js';
import { restoreRules } from '../../src/adapters/rules-snapshot.js';
import {
  retiringKey,
  scopeRegistryKey,
  ScopeRetirement,
  StaleFenceFailed,
  sweepTurnKey,
} from '../../src/adapters/scope-retire.js';
import { scopeId } from '../../src/core/learn/engine.js';
import { fixtureEvents } from '../learn-streams.js';
import { learnedServiceEnv, LOW_BAR, startAutoseq } from './predict-compare.js';
import { learnBatch, ruleCopier, rulesReplay, stalledAcrossForget } from './rule-copies.js';

const events = fixtureEvents();
/** The fixture's events as another agent's (a second scope); `again`: as new tasks of it, with new ids. */
const asAgent = (agent: string, again = ''): ToolCallsEvent[] =>
  events.map((e) => ({
    ...e,
    agent_id: agent,
    event_id: e.event_id + again,
    ...(e.task_id === undefined ? {} : { task_id: e.task_id + again }),
  }));

// Short lifetimes so that real time runs them out: Redis's PTTL is the sweep's clock, and it cannot be faked. A
// long grace: a scope is due 1.5 s after its write and stays due (not expired by Redis) for two minutes.
const TTL = 1500;
const GRACE = 120_000;

const S = (agent: string) => JSON.stringify(['default', agent]);

/** `paver_autoseq_scopes_retired_total{outcome}` as the service reports it now (0 when not yet counted). */
const retiredCount = async (p: Proc, outcome: string) =>
  parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
    'paver_autoseq_scopes_retired_total',
    {
      outcome,
    },
  ) ?? 0;

describe('idle scopes retired from Redis and from the rules topic (real Kafka and Redis)', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  const limitedSinks: Sink[] = [];
  afterAll(async () => {
    await sink.disconnect();
    for (const s of limitedSinks) await s.disconnect();
    await redis.quit();
  });

  /** The real sink, whose sends fail while `down` (a broker outage). */
  const flakySink = () => {
    const f: { down: boolean; sink: Sink } = { down: false, sink };
    f.sink = {
      ...sink,
      sendRaw: (topic, records) =>
        f.down ? Promise.reject(new Error('broker unavailable')) : sink.sendRaw(topic, records),
    };
    return f;
  };

  /** The real sink, running `before` (once, then cleared) ahead of its next send: a stall, at the worst moment. */
  const hookedSink = () => {
    const h: { before: (() => Promise<void>) | null; sink: Sink } = { before: null, sink };
    h.sink = {
      ...sink,
      sendRaw: async (topic, records) => {
        const f = h.before;
        h.before = null;
        if (f) await f();
        await sink.sendRaw(topic, records);
      },
    };
    return h;
  };

  /**
   * The real client, running `before` (once, then cleared) ahead of the next pipeline that reads a retiring set:
   * the read of a retirement's names before its tombstones, at the worst moment.
   */
  const hookedRedis = () => {
    const h: { before: (() => Promise<void>) | null; redis: Redis } = { before: null, redis };
    h.redis = new Proxy(redis, {
      get(target, prop) {
        if (prop === 'pipeline')
          return () => {
            const pipe = target.pipeline();
            const smembers = pipe.smembers.bind(pipe);
            const exec = pipe.exec.bind(pipe);
            let reads = false;
            pipe.smembers = ((...args: Parameters<typeof smembers>) => {
              reads = true;
              return smembers(...args);
            }) as typeof pipe.smembers;
            pipe.exec = (async () => {
              const f = reads ? h.before : null;
              if (f) {
                h.before = null;
                await f();
              }
              return exec();
            }) as typeof pipe.exec;
            return pipe;
          };
        const v: unknown = Reflect.get(target, prop, target);
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      },
    });
    return h;
  };

  /** A prefix, its rules topic, a copier registering what it copies, and the sweep, wired as the service does. */
  async function setup(opts: { sink?: Sink; redis?: Redis; limit?: (prefix: string) => number } = {}) {
    const prefix = unique('paver-test');
    const topic = unique('autoseq-rules');
    // PAVER_MAX_OUTPUT_BYTES, and the topic's max.message.bytes with it (the sink, the copier and the sweep held to it).
    const limit = opts.limit?.(prefix);
    await createTopics([
      {
        topic,
        partitions: 2,
        compacted: true,
        ...(limit ? { config: { 'max.message.bytes': String(limit) } } : {}),
      },
    ]);
    await sink.connect();
    const limited = limit ? createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: limit }) : null;
    if (limited) {
      await limited.connect();
      limitedSinks.push(limited);
    }
    const theSink = opts.sink ?? limited ?? sink;
    const metrics = createAutoseqMetrics(new Registry(), () => 0);
    // The epoch marker as a guard left it: a scope without state is Redis's to have forgotten only while it holds.
    const epoch = { key: `${prefix}:aseq:epoch`, flag: restoreFlagKey(`${prefix}:aseq:epoch`), seen: 'e1' };
    await redis.set(epoch.key, epoch.seen);
    const copier: { snapshots?: ReturnType<typeof ruleCopier>['snapshots'] } = {};
    /** One instance's sweep (several may run against the same prefix, as instances do). */
    const sweeper = (
      over: {
        sink?: Sink;
        redis?: Redis;
        sweeps?: boolean;
        maxRecordBytes?: number;
        log?: ReturnType<typeof silentLogger>;
      } = {},
    ) =>
      new ScopeRetirement({
        sweeps: over.sweeps ?? true,
        maxRecordBytes: over.maxRecordBytes ?? limit,
        redis: over.redis ?? opts.redis ?? redis,
        prefix,
        sink: over.sink ?? theSink,
        topic,
        leaseMs: 10_000,
        graceMs: GRACE,
        log: over.log ?? silentLogger(),
        paused: () => false,
        epoch: { key: epoch.key, flag: epoch.flag, value: () => epoch.seen },
        onRetired: (outcome, n) => metrics.scopesRetired.inc({ outcome }, n),
        onRecords: (kind, n) => metrics.snapshot.records.inc({ kind }, n),
        recopy: (written) => copier.snapshots!.mark(written),
      });
    const retirement = sweeper();
    const { snapshots, metrics: copies } = ruleCopier(redis, prefix, theSink, topic, retirement, limit);
    copier.snapshots = snapshots;
    const replay = rulesReplay(topic);
    /** One batch learned, saved with the TTL and its grace (`ttlMs`), and copied, as the service does. */
    const learn = async (batch: ToolCallsEvent[], ttlMs = TTL + GRACE) => {
      const store = await learnBatch(redis, prefix, batch, LOW_BAR, ttlMs);
      snapshots.mark(store.written());
      await snapshots.flush();
      return store.written();
    };
    /** Each scope the topic holds now, with its contexts (tombstoned records left out, as a restore reads it). */
    const inTopic = async () =>
      (await readRulesLog(rulesReplay(topic), prefix)).scopes.map((s) => `${s.agent}:${s.ctxs.size}`).sort();
    /** A scope's contexts on the topic and in Redis. */
    const topicCtxs = async (agent: string) =>
      [
        ...((await readRulesLog(rulesReplay(topic), prefix)).scopes
          .find((s) => s.agent === agent)
          ?.ctxs.keys() ?? []),
      ].sort();
    const redisCtxs = async (agent: string) =>
      (await redis.hkeys(learnKey(prefix, 'default', agent)))
        .filter((f) => f.startsWith('c:'))
        .map((f) => f.slice(2))
        .sort();
    /** The latest value of a scope's scope record on the topic (null: tombstoned; undefined: none). */
    const scopeRecord = async (agent: string) =>
      (await readLatest(rulesReplay(topic))).get(scopeRecordKey(prefix, 'default', agent));
    const registered = async () => (await redis.smembers(scopeRegistryKey(prefix))).sort();
    const retired = async (outcome: string) =>
      (await metrics.scopesRetired.get()).values.find((v) => v.labels.outcome === outcome)?.value ?? 0;
    /** Until the scope has been idle for the TTL (its hash has no more than the grace left). */
    const idle = (agent: string) =>
      waitFor(
        async () => (await redis.pttl(learnKey(prefix, 'default', agent))) <= GRACE,
        `${agent} idle for the TTL`,
      );
    /** Redis loses the service's state: every key of the prefix, as a FLUSHALL would (other tests share Redis). */
    const lose = async () => {
      let cursor = '0';
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        cursor = next;
        if (keys.length > 0) await redis.del(...keys);
      } while (cursor !== '0');
    };
    /** The guard notices a loss: a new marker, created with the restore's flag (`createEpoch`), and seen. */
    const newEpoch = async () => {
      epoch.seen = `${epoch.seen}+`;
      await redis.set(epoch.key, epoch.seen);
      await redis.set(epoch.flag, String(Date.now()));
    };
    /** The restore after a loss, at a TTL of an hour, with the sweep, as the service runs it. */
    const restore = () =>
      restoreRules(redis, prefix, epoch.flag, replay, () => true, 3_600_000, Date.now, {
        retirement,
        graceMs: GRACE,
      });
    /** `paver_autoseq_rules_snapshot_records_total{kind}` as the sweeps count it. */
    const sweptRecords = async (kind: string) =>
      (await metrics.snapshot.records.get()).values.find((v) => v.labels.kind === kind)?.value ?? 0;
    const failedCopies = async () =>
      (await copies.flushes.get()).values.find((v) => v.labels.outcome === 'failed')?.value ?? 0;
    return {
      prefix,
      topic,
      epoch,
      failedCopies,
      sweptRecords,
      lose,
      newEpoch,
      restore,
      retirement,
      sweeper,
      snapshots,
      replay,
      learn,
      inTopic,
      topicCtxs,
      redisCtxs,
      scopeRecord,
      registered,
      retired,
      idle,
    };
  }

  it('retires a scope idle for the TTL: its records tombstoned, its state deleted; a scope idle for less is kept', async () => {
    const t = await setup();
    await t.learn(asAgent('idle'));
    await t.learn(asAgent('busy'), 3_600_000);
    expect(await t.registered()).toEqual([S('busy'), S('idle')]);
    const before = await t.inTopic();
    expect(before).toHaveLength(2);
    expect(await t.scopeRecord('idle')).toBeTruthy();

    await t.idle('idle');
    expect(await t.retirement.sweep()).toEqual({ retired: 1, gone: 0, failed: 0 });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'idle'))).toBe(0);
    expect(await redis.exists(retiringKey(t.prefix, 'default', 'idle'))).toBe(0);
    expect(await t.registered()).toEqual([S('busy')]);
    expect(await t.inTopic()).toEqual(before.filter((s) => s.startsWith('busy:')));
    expect(await t.scopeRecord('idle')).toBeNull();
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
    await t.idle('a');
    expect(await t.retirement.sweep()).toMatchObject({ retired: 1 });
    expect(await t.inTopic()).toEqual([]);
    await t.learn(asAgent('a', ':again'));
    expect(await t.registered()).toEqual([S('a')]);
    expect(await t.inTopic()).toEqual(first);
    await t.idle('a');
    expect(await t.retirement.sweep()).toMatchObject({ retired: 1 });
    expect(await t.inTopic()).toEqual([]);
  });

  it('leaves a scope whose lease a batch holds, and drops from the registry one Redis expired first', async () => {
    const t = await setup();
    await t.learn(asAgent('held'));
    const before = await t.inTopic();
    await t.learn(asAgent('expired'), 1000);
    await t.idle('held');
    const batch = new ScopeLeases(redis, t.prefix, { ttlMs: 10_000 });
    await batch.acquire([{ id: scopeId('default', 'held'), tenant: 'default', agent: 'held' }]);
    await waitFor(async () => (await redis.exists(learnKey(t.prefix, 'default', 'expired'))) === 0, 'expiry');
    // Held: a batch is learning in it, so it is not idle whatever its TTL says.
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 1, failed: 0 });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'held'))).toBe(1);
    expect((await t.inTopic()).filter((s) => s.startsWith('held:'))).toEqual(before);
    expect(await t.registered()).toEqual([S('held')]);
    expect(await t.retired('gone')).toBe(1);
    await batch.release();
    expect(await t.retirement.sweep()).toEqual({ retired: 1, gone: 0, failed: 0 });
    expect(await t.registered()).toEqual([]);
  });

  it('a scope that comes back while its tombstones are sent, past the lease, ends on the topic as in Redis', async () => {
    // The real sink; before the tombstones go, the sweep's lease runs out and a batch brings the scope back,
    // whose copy lands first.
    const slow = hookedSink();
    const t = await setup({ sink: slow.sink });
    await t.learn(asAgent('s'));
    await t.idle('s');
    slow.before = async () => {
      await redis.del(leaseKey(t.prefix, 'default', 's'));
      await t.learn(asAgent('s', ':again').slice(0, 40), 3_600_000);
    };
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 1 });
    const live = await t.redisCtxs('s');
    expect(live.length).toBeGreaterThan(0);
    // The tombstones went after the revived scope's copy: they are copied over again.
    expect(t.snapshots.pending()).toBeGreaterThan(0);
    await t.snapshots.flush();
    expect(await t.topicCtxs('s')).toEqual(live);
    // The unfinished retirement is finished by the next sweep, leaving the live scope's records alone (and the
    // scope, live, is not counted as retired).
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(1);
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.failedCopies()).toBe(0);
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(0);
    expect(await t.topicCtxs('s')).toEqual(live);
    expect(await t.registered()).toEqual([S('s')]);
  });

  it('an instance that dies between the two steps leaves the retirement for the next sweep, which spares a revived scope', async () => {
    let hang = false;
    let release = () => undefined as void;
    const dead = new Promise<void>((r) => (release = r));
    const dying: Sink = {
      ...sink,
      sendRaw: async (topic, records) => {
        if (hang) {
          await dead; // the process died here (let go at the end of the test, and failing then)
          throw new Error('the instance was dead');
        }
        await sink.sendRaw(topic, records);
      },
    };
    const t = await setup();
    await t.learn(asAgent('s'));
    const before = await t.topicCtxs('s');
    await t.idle('s');
    hang = true;
    const dyingSweep = t.sweeper({ sink: dying }).sweep();
    await waitFor(async () => (await redis.exists(retiringKey(t.prefix, 'default', 's'))) === 1, 'step 1');
    // Step 1 took the state: a batch of the scope now starts afresh (the rules were idle for the TTL).
    expect(await redis.exists(learnKey(t.prefix, 'default', 's'))).toBe(0);
    expect(await t.topicCtxs('s')).toEqual(before);
    // The dead instance's lease runs out; the scope comes back with a few events before another sweep.
    await redis.del(leaseKey(t.prefix, 'default', 's'));
    await t.learn(asAgent('s', ':again').slice(0, 6), 3_600_000);
    const live = await t.redisCtxs('s');
    expect(live.length).toBeGreaterThan(0);
    expect(live.length).toBeLessThan(before.length);

    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(0);
    expect(await t.topicCtxs('s')).toEqual(live);
    expect(await t.scopeRecord('s')).toBeTruthy();
    expect(await t.registered()).toEqual([S('s')]);
    expect(await t.retired('retired')).toBe(0);
    release();
    expect(await dyingSweep).toMatchObject({ failed: 1 });
  });

  it('retires in one sweep a scope that came back during an unfinished retirement and went idle again', async () => {
    const flaky = flakySink();
    const t = await setup({ sink: flaky.sink });
    await t.learn(asAgent('s'));
    await t.idle('s');
    flaky.down = true;
    expect(await t.retirement.sweep()).toMatchObject({ retired: 0, failed: 1 });
    flaky.down = false;
    await t.learn(asAgent('s', ':again').slice(0, 6));
    await t.idle('s');
    expect(await t.retirement.sweep()).toEqual({ retired: 1, gone: 0, failed: 0 });
    expect(await redis.exists(learnKey(t.prefix, 'default', 's'))).toBe(0);
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(0);
    expect(await t.inTopic()).toEqual([]);
    expect(await t.scopeRecord('s')).toBeNull();
    expect(await t.registered()).toEqual([]);
  });

  it('puts back in the registry a scope that came back while the sweep stalled before taking it out', async () => {
    let onSrem: (() => Promise<void>) | null = null;
    const stalling = new Proxy(redis, {
      get(target, k) {
        if (k === 'srem' && onSrem) {
          const f = onSrem;
          onSrem = null;
          return async (...a: Parameters<Redis['srem']>) => {
            await f();
            return target.srem(...a);
          };
        }
        const v = Reflect.get(target, k, target) as unknown;
        return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
      },
    });
    const t = await setup();
    await t.learn(asAgent('s'));
    await t.idle('s');
    // Past the lease, after the tombstones: a batch revives the scope and its copy registers it.
    onSrem = async () => {
      await redis.del(leaseKey(t.prefix, 'default', 's'));
      await t.learn(asAgent('s', ':again'), 3_600_000);
      expect(await t.registered()).toEqual([S('s')]);
    };
    expect(await t.sweeper({ redis: stalling }).sweep()).toMatchObject({ retired: 1 });
    expect((await t.redisCtxs('s')).length).toBeGreaterThan(0);
    expect(await t.topicCtxs('s')).toEqual(await t.redisCtxs('s'));
    expect(await t.registered()).toEqual([S('s')]);
  });

  it('a restore leaves out scopes expired or retired, and queues them for the sweep, which spares one that came back', async () => {
    const t = await setup();
    await t.learn(asAgent('old'), 3_600_000);
    await t.learn(asAgent('back'), 3_600_000);
    await t.learn(asAgent('gone'));
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    await t.idle('gone');
    expect(await t.retirement.sweep()).toMatchObject({ retired: 1 });
    // A record of the retired scope that outlived its tombstones (an eviction's copy landing late, say).
    await sink.sendRaw(t.topic, [
      { key: contextRecordKey(t.prefix, 'default', 'gone', 'left-over'), value: contextRecordValue('{}') },
    ]);
    // `old` was lost with Redis; `back` has state again, fewer contexts than its copy. The restore runs a day
    // later: every copy is expired.
    await redis.del(learnKey(t.prefix, 'default', 'old'));
    await redis.del(learnKey(t.prefix, 'default', 'back'));
    await t.learn(asAgent('back', ':again').slice(0, 6), 3_600_000);
    const live = await t.redisCtxs('back');
    expect(live.length).toBeLessThan((await t.topicCtxs('back')).length);
    const restoreAt = (ttl: number, now: () => number) =>
      restoreRules(redis, t.prefix, flag, t.replay, () => true, ttl, now, {
        retirement: t.retirement,
        graceMs: GRACE,
      });
    expect(await restoreAt(TTL, () => Date.now() + 86_400_000)).toMatchObject({
      scopes: 3,
      restored: 0,
      expired: 3,
    });
    expect(await t.retired('expired_at_restore')).toBe(2);
    expect(await t.registered()).toEqual([S('back'), S('gone'), S('old')]);
    // The sweep finishes them: what `back` holds stays, with its scope record; the rest goes.
    expect(await t.retirement.sweep()).toEqual({ retired: 2, gone: 0, failed: 0 });
    expect(await t.inTopic()).toEqual([`back:${live.length}`]);
    expect(await t.topicCtxs('back')).toEqual(live);
    expect(await t.scopeRecord('back')).toBeTruthy();
    expect(await t.registered()).toEqual([S('back')]);

    // Restored ones are registered for the sweep, with the grace past what was left of their lifetime.
    await redis.del(learnKey(t.prefix, 'default', 'back'));
    await redis.del(scopeRegistryKey(t.prefix));
    expect(await restoreAt(3_600_000, Date.now)).toMatchObject({ restored: 1, expired: 0 });
    expect(await t.registered()).toEqual([S('back')]);
    const left = await redis.pttl(learnKey(t.prefix, 'default', 'back'));
    expect(left).toBeGreaterThan(3_600_000 - 120_000);
    expect(left).toBeLessThanOrEqual(3_600_000 + GRACE);
    await redis.del(learnKey(t.prefix, 'default', 'back'));
  });

  it('a retired scope stays retired when the TTL is then set to 0: a restore without the sweep leaves its leftovers out', async () => {
    const t = await setup();
    await t.learn(asAgent('live'), 3_600_000);
    await t.learn(asAgent('gone'));
    await t.idle('gone');
    expect(await t.retirement.sweep()).toMatchObject({ retired: 1 });
    expect(await t.scopeRecord('gone')).toBeNull();
    // A record of the retired scope that outlived its tombstones (an eviction's copy landing late, say).
    await sink.sendRaw(t.topic, [
      { key: contextRecordKey(t.prefix, 'default', 'gone', 'left-over'), value: contextRecordValue('{}') },
    ]);
    // AUTOSEQ_LEARN_SCOPE_TTL_MS=0 from now on (no sweep, no idle lifetime), and Redis is lost.
    await redis.del(learnKey(t.prefix, 'default', 'live'));
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    expect(await restoreRules(redis, t.prefix, flag, t.replay, () => true, 0)).toMatchObject({
      scopes: 2,
      restored: 1,
      expired: 1,
    });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'gone'))).toBe(0);
    expect(await readScope(redis, t.prefix, 'default', 'live')).not.toBeNull();
    // Without an idle lifetime the restored scope never expires, as with the TTL 0 everywhere else.
    expect(await redis.pttl(learnKey(t.prefix, 'default', 'live'))).toBe(-1);
    await redis.del(learnKey(t.prefix, 'default', 'live'));
  });

  it('tombstones the scope record of a scope Redis expired, so a restore at TTL 0 leaves it out; never one Redis lost', async () => {
    const t = await setup();
    await t.learn(asAgent('live'), 3_600_000);
    await t.learn(asAgent('expired'), 1000);
    await waitFor(async () => (await redis.exists(learnKey(t.prefix, 'default', 'expired'))) === 0, 'expiry');
    // Redis lost its state and another instance's guard put a new marker in: a scope without state may be one
    // the restore will bring back, so its records stay (and it stays in the registry for a later sweep).
    await redis.set(t.epoch.key, 'another');
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.scopeRecord('expired')).toBeTruthy();
    // The same while a restore is under way (its flag set).
    await redis.set(t.epoch.key, t.epoch.seen);
    await redis.set(t.epoch.flag, '1');
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.scopeRecord('expired')).toBeTruthy();
    expect(await t.registered()).toEqual([S('expired'), S('live')]);
    await redis.del(t.epoch.flag);

    // The marker as the guard saw it: Redis's own expiry took the scope. Its scope record is tombstoned.
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 1, failed: 0 });
    expect(await t.scopeRecord('expired')).toBeNull();
    expect(await t.scopeRecord('live')).toBeTruthy();
    expect(await t.registered()).toEqual([S('live')]);
    expect(await t.retired('gone')).toBe(1);

    // AUTOSEQ_LEARN_SCOPE_TTL_MS=0 from now on, and Redis is lost: the expired scope stays out.
    await redis.del(learnKey(t.prefix, 'default', 'live'));
    expect(await restoreRules(redis, t.prefix, t.epoch.flag, t.replay, () => true, 0)).toMatchObject({
      restored: 1,
      expired: 1,
    });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'expired'))).toBe(0);
    expect(await readScope(redis, t.prefix, 'default', 'live')).not.toBeNull();
    await redis.del(learnKey(t.prefix, 'default', 'live'));
  });

  it('forgets a scope at once, in Redis and on the rules topic: a restore after a loss leaves it out, at any TTL', async () => {
    const t = await setup();
    await t.learn(asAgent('keep'), 3_600_000);
    await t.learn(asAgent('forget'), 3_600_000);
    const ctxs = await t.topicCtxs('forget');
    expect(ctxs.length).toBeGreaterThan(0);

    expect(await t.retirement.forget('default', 'forget')).toEqual({ state: true, contexts: ctxs.length });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'forget'))).toBe(0);
    expect(await redis.exists(retiringKey(t.prefix, 'default', 'forget'))).toBe(0);
    expect(await t.scopeRecord('forget')).toBeNull();
    expect(await t.topicCtxs('forget')).toEqual([]);
    expect(await t.registered()).toEqual([S('keep')]);
    // Again, with no state left: nothing to delete, the scope record tombstoned again.
    expect(await t.retirement.forget('default', 'forget')).toEqual({ state: false, contexts: 0 });

    // Redis is lost; a restore at TTL 0 (no idle lifetime, no sweep) and at TTL > 0 both leave it out.
    for (const ttl of [0, 3_600_000]) {
      await redis.del(learnKey(t.prefix, 'default', 'keep'));
      expect(await restoreRules(redis, t.prefix, t.epoch.flag, t.replay, () => true, ttl)).toMatchObject({
        restored: 1,
      });
      expect(await readScope(redis, t.prefix, 'default', 'forget')).toBeNull();
      expect(await readScope(redis, t.prefix, 'default', 'keep')).not.toBeNull();
    }

    // A forget waits for a batch that holds the scope's lease, and refuses while a loss is not restored.
    await t.learn(asAgent('forget', ':again'), 3_600_000);
    const batch = new ScopeLeases(redis, t.prefix, { ttlMs: 10_000 });
    await batch.acquire([{ id: scopeId('default', 'forget'), tenant: 'default', agent: 'forget' }]);
    let forgot = false;
    const forgetting = t.retirement.forget('default', 'forget').then((r) => ((forgot = true), r));
    // Waiting: it marked the scope as wanted.
    await waitFor(async () => (await redis.exists(wantKey(t.prefix, 'default', 'forget'))) === 1, 'waiting');
    expect(forgot).toBe(false);
    expect(await redis.exists(learnKey(t.prefix, 'default', 'forget'))).toBe(1);
    await batch.release();
    expect(await forgetting).toMatchObject({ state: true });
    await redis.set(t.epoch.key, 'another');
    await expect(t.retirement.forget('default', 'keep')).rejects.toMatchObject({ code: 'STATE_CONTENDED' });
    expect(await readScope(redis, t.prefix, 'default', 'keep')).not.toBeNull();
    await redis.del(learnKey(t.prefix, 'default', 'keep'));
  });

  it('one instance sweeps per period: the turn goes to the first to ask, and to another once the period is over', async () => {
    const t = await setup();
    const [a, b, c] = [t.retirement, t.sweeper(), t.sweeper()];
    // Asked at once, as the instances' timers do: one sweeps, the others leave the registry alone.
    const turns = await Promise.all([a, b, c].map((r) => r.takeTurn(60_000)));
    expect(turns.filter(Boolean)).toHaveLength(1);
    expect(await a.takeTurn(60_000)).toBe(false);
    // The holder dies: the turn expires with its period, and another instance takes it.
    await redis.del(sweepTurnKey(t.prefix));
    expect(await b.takeTurn(400)).toBe(true);
    expect(await c.takeTurn(400)).toBe(false);
    await waitFor(async () => await c.takeTurn(400), 'the turn free after its period');
    expect(await redis.pttl(sweepTurnKey(t.prefix))).toBeGreaterThan(0);
  });

  it('a scope whose only record is its scope record is restored when recent, and retired when expired', async () => {
    const t = await setup();
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    const now = Date.now();
    // Every context of theirs was tombstoned (evicted) before Redis was lost.
    await sink.sendRaw(t.topic, [
      { key: scopeRecordKey(t.prefix, 'default', 'recent'), value: scopeRecordValue(7, undefined, now) },
      {
        key: scopeRecordKey(t.prefix, 'default', 'stale'),
        value: scopeRecordValue(9, undefined, now - 86_400_000),
      },
      { key: contextRecordKey(t.prefix, 'default', 'stale', 'a'), value: null },
    ]);
    expect(
      await restoreRules(redis, t.prefix, flag, t.replay, () => true, 3_600_000, Date.now, {
        retirement: t.retirement,
        graceMs: GRACE,
      }),
    ).toMatchObject({ scopes: 2, restored: 1, expired: 1 });
    expect((await readScope(redis, t.prefix, 'default', 'recent'))?.clock).toBe(7);
    expect(await t.registered()).toEqual([S('recent'), S('stale')]);
    expect(await t.retirement.sweep()).toMatchObject({ retired: 1, failed: 0 });
    expect(await t.scopeRecord('stale')).toBeNull();
    expect(await t.scopeRecord('recent')).toBeTruthy();
    expect(await t.registered()).toEqual([S('recent')]);
    await redis.del(learnKey(t.prefix, 'default', 'recent'));
  });

  it('a restore never writes back a scope whose retirement is under way; the sweep retries a failed send', async () => {
    const flaky = flakySink();
    const t = await setup({ sink: flaky.sink });
    await t.learn(asAgent('old'), 3_600_000);
    await t.learn(asAgent('s'));
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    // `s` is retired as far as its first step (the broker is down for the tombstones), then Redis loses `old`.
    await t.idle('s');
    flaky.down = true;
    expect(await t.retirement.sweep()).toMatchObject({ failed: 1 });
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(1);
    await redis.del(learnKey(t.prefix, 'default', 'old'));
    const retire = { retirement: t.retirement, graceMs: GRACE };
    // `s`'s copy is as recent as `old`'s, but its retirement is under way: it stays retired.
    expect(
      await restoreRules(redis, t.prefix, flag, t.replay, () => true, 3_600_000, Date.now, retire),
    ).toMatchObject({ scopes: 2, restored: 1, expired: 0 });
    expect(await redis.exists(learnKey(t.prefix, 'default', 'old'))).toBe(1);
    expect(await redis.exists(learnKey(t.prefix, 'default', 's'))).toBe(0);
    expect(await t.retirement.sweep()).toMatchObject({ retired: 0, failed: 1 });
    flaky.down = false;
    expect(await t.retirement.sweep()).toEqual({ retired: 1, gone: 0, failed: 0 });
    expect(await t.inTopic()).toEqual([expect.stringMatching(/^old:/)]);
    await redis.del(learnKey(t.prefix, 'default', 'old'));
  });

  it("a retirement's tombstones wait while Redis is lost: a scope lost with it as the sweep read it comes back whole", async () => {
    const flaky = flakySink();
    const t = await setup({ sink: flaky.sink });
    await t.learn(asAgent('b'));
    // `b`'s retirement is left unfinished (the broker down for its tombstones), then `b` comes back.
    await t.idle('b');
    flaky.down = true;
    expect(await t.retirement.sweep()).toMatchObject({ failed: 1 });
    flaky.down = false;
    await t.learn(asAgent('b', ':again').slice(0, 6), 3_600_000);
    const live = await t.redisCtxs('b');
    expect(live.length).toBeGreaterThan(0);
    expect(await redis.exists(retiringKey(t.prefix, 'default', 'b'))).toBe(1);
    // A sweep finishes the retirement, and Redis loses its state between its read of `b` and that of its names:
    // it finds no names and no state. Before, it tombstoned `b`'s scope record, and the restore left `b` out.
    const hooked = hookedRedis();
    hooked.before = t.lose;
    const swept = await t.sweeper({ redis: hooked.redis }).sweep();
    expect(hooked.before).toBeNull();
    expect(await t.scopeRecord('b')).toBeTruthy();
    expect(swept).toEqual({ retired: 0, gone: 0, failed: 0 });
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 1 });
    expect(await t.redisCtxs('b')).toEqual(expect.arrayContaining(live));
    // Once restored, nothing left to retire: it stays.
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.scopeRecord('b')).toBeTruthy();
    await redis.del(learnKey(t.prefix, 'default', 'b'));
  });

  it('a stop right after a restore never drops its queue of expired scopes', async () => {
    const t = await setup();
    // The topic holds 20 scopes idle for a day (their state and the registry went with Redis).
    const at = Date.now() - 86_400_000;
    await sink.sendRaw(
      t.topic,
      Array.from({ length: 20 }, (_, i) => [
        { key: scopeRecordKey(t.prefix, 'default', `a${i}`), value: scopeRecordValue(1, undefined, at) },
        { key: contextRecordKey(t.prefix, 'default', `a${i}`, 'c'), value: contextRecordValue('{}') },
      ]).flat(),
    );
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    expect(
      await restoreRules(redis, t.prefix, flag, t.replay, () => true, TTL, Date.now, {
        retirement: t.retirement,
        graceMs: GRACE,
      }),
    ).toMatchObject({ expired: 20 });
    await t.retirement.stop(); // a SIGTERM right after the restore (a rolling deploy)
    expect(await redis.exists(flag)).toBe(0);
    // The next instance's sweep finishes every one.
    expect(await t.sweeper().sweep()).toMatchObject({ retired: 20, failed: 0 });
    expect(await t.inTopic()).toEqual([]);
    expect(await t.retired('expired_at_restore')).toBe(20);
  });

  it("a copy whose send outlasts its lease, landing after a retirement's tombstones, is retired again", async () => {
    const t = await setup();
    const written = await t.learn(asAgent('s'));
    await t.idle('s');
    const slow = hookedSink();
    slow.before = async () => {
      // The copy's send stalls past its lease; the sweep takes the lease and retires the scope.
      await redis.del(leaseKey(t.prefix, 'default', 's'));
      expect(await t.retirement.sweep()).toMatchObject({ retired: 1 });
    };
    const late = ruleCopier(redis, t.prefix, slow.sink, t.topic, t.retirement).snapshots;
    late.mark(written); // marks kept from copies that failed while the broker was down
    await late.flush();
    // Tombstoned again at once, without a retirement queued for the next sweep.
    expect(await t.inTopic()).toEqual([]);
    expect(await t.scopeRecord('s')).toBeNull();
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(0);
    // The copy registered it again: the next sweep finds it without state and takes it out.
    expect(await t.retirement.sweep()).toMatchObject({ retired: 0, failed: 0 });
    expect(await t.inTopic()).toEqual([]);
    expect(await t.scopeRecord('s')).toBeNull();
    expect(await t.registered()).toEqual([]);
  });

  it("at TTL > 0, a copy landing after a forget's tombstones is tombstoned again at once: a Redis loss before the next sweep does not bring the scope back", async () => {
    const t = await setup();
    const written = await t.learn(asAgent('f'), 3_600_000);
    const ctxs = await t.topicCtxs('f');
    expect(ctxs.length).toBeGreaterThan(0);
    const slow = hookedSink();
    slow.before = async () => {
      // The copy took its snapshot, then stalls past its lease; POST /rules/forget takes the lease meanwhile.
      await redis.del(leaseKey(t.prefix, 'default', 'f'));
      expect(await t.retirement.forget('default', 'f')).toEqual({ state: true, contexts: ctxs.length });
      // The copy's own registration (sent beside its records) lands after the forget took the scope out.
      await t.retirement.register([{ tenant: 'default', agent: 'f' }]);
    };
    const late = ruleCopier(redis, t.prefix, slow.sink, t.topic, t.retirement).snapshots;
    late.mark(written);
    await late.flush();
    expect(await t.scopeRecord('f')).toBeNull();
    expect(await t.inTopic()).toEqual([]);
    // Fenced: nothing left for the sweep. Before, the stale copy's registration stayed, and the next sweep took the
    // scope for one Redis's expiry took (`gone`).
    expect(await t.registered()).toEqual([]);
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    // Redis loses its state before any sweep. Before, the copy's records were queued for the sweep in Redis, lost
    // with it, and the restore brought the forgotten scope back until it idled out again.
    await t.lose();
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 0 });
    expect(await readScope(redis, t.prefix, 'default', 'f')).toBeNull();
  });

  it("at TTL > 0, a stale copy's fence whose send fails is left to the sweep, which tombstones the copy's records and counts it as a stale copy", async () => {
    const t = await setup();
    const written = await t.learn(asAgent('f'), 3_600_000);
    // The copy stalls past its lease; POST /rules/forget takes the lease meanwhile.
    // The fence's own send: the broker is down.
    const stalled = stalledAcrossForget(redis, sink, t.prefix, t.retirement);
    // The copier's instance, whose fence sends through the same failing sink.
    const logged: { msg: string; err?: string; copy?: string }[] = [];
    const log = pino({ level: 'warn' }, { write: (line: string) => logged.push(JSON.parse(line)) });
    const late = ruleCopier(
      redis,
      t.prefix,
      stalled.sink,
      t.topic,
      t.sweeper({ sink: stalled.sink }),
      undefined,
      log,
    ).snapshots;
    late.mark(written);
    await late.flush();
    expect(stalled.sends()).toBe(2);
    // Both failures are logged: the failed copy with its own error (the lease lost), not the fence's in its place.
    const failed = logged.find((l) => l.msg.includes('not copied to the rules topic'));
    expect(failed?.err).toMatch(/scope lease lost/);
    const fence = logged.find((l) => l.msg.includes('not fenced'));
    expect(fence).toMatchObject({ err: 'broker unavailable' });
    expect(fence?.copy).toMatch(/scope lease lost/);
    expect(await t.scopeRecord('f')).toBeTruthy();
    /** The scope's context records that are not tombstones, as the topic holds them now (its marker is none). */
    const liveContexts = async () => {
      const head = JSON.stringify([t.prefix, 'default', 'f']).slice(0, -1) + ',';
      const marker = forgetMarkerKey(t.prefix, 'default', 'f');
      return [...(await readLatest(rulesReplay(t.topic))).entries()].filter(
        ([k, v]) => k.startsWith(head) && k !== marker && v !== null,
      ).length;
    };
    expect(await liveContexts()).toBeGreaterThan(0);
    expect(await t.registered()).toEqual([S('f')]);
    // The scope was forgotten, and its copy landed late: Redis's expiry took nothing. Before, the sweep counted it
    // `gone` ("Redis expired it before a sweep") and left the copy's context records on the topic.
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.retired('gone')).toBe(0);
    expect(await t.retired('stale_copy')).toBe(1);
    expect(await t.scopeRecord('f')).toBeNull();
    expect(await liveContexts()).toBe(0);
    expect(await t.registered()).toEqual([]);
    await t.lose();
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 0 });
  });

  it('at TTL > 0, a copy stalled across a Redis loss leaves the lost scope alone: the restore brings its rules back, and the sweep keeps them', async () => {
    const t = await setup();
    const written = await t.learn(asAgent('s'), 3_600_000);
    const before = await t.redisCtxs('s');
    expect(before.length).toBeGreaterThan(0);
    const slow = hookedSink();
    // Redis loses its state (the copy's lease with it) while the copy's send stalls.
    slow.before = t.lose;
    const late = ruleCopier(redis, t.prefix, slow.sink, t.topic, t.retirement).snapshots;
    late.mark(written);
    await late.flush();
    // A sweep before this instance's guard notices the loss leaves the scope's records alone.
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.scopeRecord('s')).toBeTruthy();
    // The guard notices, and restores: the scope comes back whole. Before, the copy queued it for the sweep as a
    // retirement on the empty Redis; the restore then left it out, and the sweep tombstoned it: lost for good.
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 1 });
    expect(await t.redisCtxs('s')).toEqual(before);
    expect(await t.retirement.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.scopeRecord('s')).toBeTruthy();
    expect((await t.topicCtxs('s')).length).toBeGreaterThan(0);
    expect(await redis.exists(retiringKey(t.prefix, 'default', 's'))).toBe(0);
    await redis.del(learnKey(t.prefix, 'default', 's'));
  });

  it("at TTL 0, a copy whose send outlasts its lease, landing after a forget's tombstones, is tombstoned again: a restore leaves the scope out", async () => {
    const t = await setup();
    // As the service wires it at TTL 0: no sweep, the forget and the copy's fence only.
    const forgetter = t.sweeper({ sweeps: false });
    const written = await t.learn(asAgent('f'), 0);
    const ctxs = await t.topicCtxs('f');
    expect(ctxs.length).toBeGreaterThan(0);
    const slow = hookedSink();
    slow.before = async () => {
      // The copy took its snapshot, then stalls past its lease; POST /rules/forget takes the lease meanwhile.
      await redis.del(leaseKey(t.prefix, 'default', 'f'));
      expect(await forgetter.forget('default', 'f')).toEqual({ state: true, contexts: ctxs.length });
      expect(await t.scopeRecord('f')).toBeNull();
    };
    const late = ruleCopier(redis, t.prefix, slow.sink, t.topic, forgetter).snapshots;
    late.mark(written); // marks kept from copies that failed while the broker was down
    await late.flush();
    // The copy landed after the forget's tombstones, and was tombstoned again.
    expect(await t.scopeRecord('f')).toBeNull();
    expect(await t.inTopic()).toEqual([]);
    // Its next try finds no state: nothing to copy.
    await late.flush();
    expect(await t.inTopic()).toEqual([]);

    // Redis loses the service's state: the restore, at TTL 0, leaves the forgotten scope out.
    await redis.del(t.epoch.key);
    expect(await restoreRules(redis, t.prefix, t.epoch.flag, t.replay)).toMatchObject({ restored: 0 });
    expect(await readScope(redis, t.prefix, 'default', 'f')).toBeNull();
  });

  /**
   * The real sink, whose first send runs `before` ahead of it and `after` once it has landed (each once): a copy
   * stalled past its lease, and what comes between its landing and its fence.
   */
  const stalledSink = (before: () => Promise<void>, after: () => Promise<void>): Sink => {
    let first = true;
    return {
      ...sink,
      sendRaw: async (topic, records) => {
        const stalled = first;
        first = false;
        if (stalled) await before();
        await sink.sendRaw(topic, records);
        if (stalled) await after();
      },
    };
  };

  it("at TTL > 0, a copy read before a forget, landing after its tombstones and lost with Redis before any fence, is left out by the restore: the forget's marker is on the topic", async () => {
    const t = await setup();
    await t.learn(asAgent('keep'), 3_600_000);
    const written = await t.learn(asAgent('f'), 3_600_000);
    const ctxs = await t.topicCtxs('f');
    expect(ctxs.length).toBeGreaterThan(0);
    const stalled = stalledSink(
      async () => {
        // The copy took its snapshot, then stalls past its lease; POST /rules/forget takes the lease meanwhile.
        await redis.del(leaseKey(t.prefix, 'default', 'f'));
        expect(await t.retirement.forget('default', 'f')).toEqual({ state: true, contexts: ctxs.length });
        expect(await t.scopeRecord('f')).toBeNull();
      },
      // Its records have landed after the tombstones; Redis loses its state before the fence reads it.
      t.lose,
    );
    const late = ruleCopier(redis, t.prefix, stalled, t.topic, t.retirement).snapshots;
    late.mark(written);
    await late.flush();
    // No fence ran (Redis was lost under it): the stale copy is the topic's latest of the scope.
    expect(await t.topicCtxs('f')).toEqual(ctxs);
    expect(await t.scopeRecord('f')).toBeTruthy();

    await t.newEpoch();
    const restored = await t.restore();
    // Before, the restore read the stale copy's scope record and brought the forgotten scope back.
    expect(await readScope(redis, t.prefix, 'default', 'f')).toBeNull();
    expect(await readScope(redis, t.prefix, 'default', 'keep')).not.toBeNull();
    expect(restored).toMatchObject({ restored: 1, forgotten: 1 });
    // Another instance restoring after the same loss leaves it out too, and does not count it again.
    expect(await t.restore()).toMatchObject({ restored: 0, forgotten: 0 });
    // Queued for the sweep as any retired scope's leftovers: tombstoned, the marker kept.
    expect(await t.retirement.sweep()).toMatchObject({ failed: 0 });
    expect(await t.inTopic()).toEqual([`keep:${(await t.redisCtxs('keep')).length}`]);
    expect(await t.scopeRecord('f')).toBeNull();
    expect(
      JSON.parse(
        String((await readLatest(rulesReplay(t.topic))).get(forgetMarkerKey(t.prefix, 'default', 'f'))),
      ),
    ).toMatchObject({ v: 1, forgets: 1 });

    // Learned again after the forget: its copy carries the forget's generation, and a restore brings it back.
    await t.learn(asAgent('f', ':again'), 3_600_000);
    expect(JSON.parse(String(await t.scopeRecord('f')))).toMatchObject({ forgets: 1 });
    const again = await t.redisCtxs('f');
    expect(again.length).toBeGreaterThan(0);
    await t.lose();
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 2, forgotten: 0 });
    expect(await t.redisCtxs('f')).toEqual(again);
    expect(await redis.get(forgetsKey(t.prefix, 'default', 'f'))).toBe('1');
    await redis.del(learnKey(t.prefix, 'default', 'f'), learnKey(t.prefix, 'default', 'keep'));
  });

  it("at TTL 0, a copy read before a forget whose fence's send fails is left out by a restore: with no retry of the fence (its copier gone), the marker holds", async () => {
    const t = await setup();
    // As the service wires it at TTL 0: no sweep, the forget and the copy's fence only.
    const forgetter = t.sweeper({ sweeps: false });
    await t.learn(asAgent('keep'), 0);
    const written = await t.learn(asAgent('f'), 0);
    // The copy stalls past its lease; POST /rules/forget takes the lease meanwhile.
    // The fence's own send: the broker is down.
    const stalled = stalledAcrossForget(redis, sink, t.prefix, forgetter);
    const late = ruleCopier(
      redis,
      t.prefix,
      stalled.sink,
      t.topic,
      t.sweeper({ sink: stalled.sink, sweeps: false }),
    ).snapshots;
    late.mark(written);
    await late.flush();
    expect(stalled.sends()).toBe(2);
    expect(await t.scopeRecord('f')).toBeTruthy();

    // Redis loses the service's state: the restore, at TTL 0, leaves the forgotten scope out. Before, it came back.
    await t.lose();
    const restored = await restoreRules(redis, t.prefix, t.epoch.flag, t.replay);
    expect(await readScope(redis, t.prefix, 'default', 'f')).toBeNull();
    expect(await readScope(redis, t.prefix, 'default', 'keep')).not.toBeNull();
    expect(restored).toMatchObject({ restored: 1, forgotten: 1 });
    await redis.del(learnKey(t.prefix, 'default', 'keep'));
  });

  it("at TTL 0, a stale copy's fence whose send failed is tried again at the next copy: the copy's records leave the topic", async () => {
    const t = await setup();
    const forgetter = t.sweeper({ sweeps: false });
    const written = await t.learn(asAgent('f'), 0);
    // The copy stalls past its lease; POST /rules/forget takes the lease meanwhile.
    // The fence's own send: the broker is down, this once.
    const stalled = stalledAcrossForget(redis, sink, t.prefix, forgetter);
    const late = ruleCopier(
      redis,
      t.prefix,
      stalled.sink,
      t.topic,
      t.sweeper({ sink: stalled.sink, sweeps: false }),
    ).snapshots;
    late.mark(written);
    await late.flush();
    expect(stalled.sends()).toBe(2);
    expect(await t.scopeRecord('f')).toBeTruthy();
    expect((await t.topicCtxs('f')).length).toBeGreaterThan(0);
    // The next copy (no sweep at TTL 0). Before, nothing tried the fence again: the copy's context records stayed
    // on the topic, and came back with the scope at a restore once it had learned again and been copied.
    await late.flush();
    expect(await t.scopeRecord('f')).toBeNull();
    expect(await t.topicCtxs('f')).toEqual([]);
  });

  it("a stale copy's failed fence is tried again for the forgotten scope alone, not for a live one copied with it", async () => {
    const t = await setup();
    const forgetter = t.sweeper({ sweeps: false });
    const written = [...(await t.learn(asAgent('f'), 0)), ...(await t.learn(asAgent('k'), 0))];
    // The copy of both stalls past f's lease; POST /rules/forget takes it meanwhile. k stays live.
    // The fence's own send: the broker is down, this once.
    const stalled = stalledAcrossForget(redis, sink, t.prefix, forgetter);
    const fenced: string[][] = [];
    const late = ruleCopier(
      redis,
      t.prefix,
      stalled.sink,
      t.topic,
      t.sweeper({ sink: stalled.sink, sweeps: false }),
      1_000_000,
      silentLogger(),
      (scopes) => fenced.push(scopes.map((s) => s.agent).sort()),
    ).snapshots;
    late.mark(written);
    await late.flush();
    expect(stalled.sends()).toBe(2);
    expect(fenced).toEqual([['f', 'k']]);
    // The next copy tries the fence again for f alone. Before, for k too: its lease taken and its marks copied
    // again at every copy while the broker failed, though the fence skips a scope with state.
    await late.flush();
    expect(fenced).toEqual([['f', 'k'], ['f']]);
    expect(await t.scopeRecord('f')).toBeNull();
    expect(await t.topicCtxs('f')).toEqual([]);
    expect((await t.topicCtxs('k')).length).toBeGreaterThan(0);
  });

  it("a stale copy's fence goes on past a failed round, and names only that round's scopes as owed", async () => {
    const t = await setup();
    // Nine scopes without state (forgotten): two rounds of the fence, the first one's send failing.
    const scopes = Array.from({ length: 9 }, (_, i) => ({ tenant: 'default', agent: `g${i}`, ctxs: ['c'] }));
    let sends = 0;
    const failing: Sink = {
      ...sink,
      sendRaw: async (topic, records) => {
        sends++;
        if (sends === 1) throw new Error('broker unavailable');
        await sink.sendRaw(topic, records);
      },
    };
    const fence = t.sweeper({ sink: failing, sweeps: false });
    const err: unknown = await fence.afterStaleCopy(scopes).then(
      () => null,
      (e: unknown) => e,
    );
    // Before, the first failure stopped it: the second round was never sent, and the caller kept all nine.
    expect(sends).toBe(2);
    expect(err).toBeInstanceOf(StaleFenceFailed);
    expect((err as StaleFenceFailed).scopes.map((s) => s.agent)).toEqual(
      scopes.slice(0, 8).map((s) => s.agent),
    );
    expect(await t.scopeRecord('g8')).toBeNull();
  });

  it('a forget on a Redis that replaced a lost one counts on from the generation the topic holds: a copy read on the lost Redis after an earlier forget stays out', async () => {
    const t = await setup();
    await t.learn(asAgent('f'), 3_600_000);
    // Forgotten once, then learned again: its copies carry generation 1.
    await t.retirement.forget('default', 'f');
    const written = await t.learn(asAgent('f', ':again'), 3_600_000);
    const copied = JSON.parse(String(await t.scopeRecord('f'))) as unknown;
    let seeded: string | null = null;
    const stalled = stalledSink(
      async () => {
        // The copy read the scope (generation 1), then stalls; Redis is lost meanwhile, and restored: the scope
        // comes back from its latest copy, and its generation with it. The operator forgets it again there.
        await t.lose();
        await t.newEpoch();
        expect(await t.restore()).toMatchObject({ restored: 1 });
        seeded = await redis.get(forgetsKey(t.prefix, 'default', 'f'));
        expect(await t.retirement.forget('default', 'f')).toMatchObject({ state: true });
      },
      // The stale copy (generation 1) has landed after the second forget's tombstones; Redis is lost again.
      t.lose,
    );
    const late = ruleCopier(redis, t.prefix, stalled, t.topic, t.retirement).snapshots;
    late.mark(written);
    await late.flush();
    await t.newEpoch();
    const restored = await t.restore();
    expect(await readScope(redis, t.prefix, 'default', 'f')).toBeNull();
    // The second forget's marker is generation 2, not 1 as a count started afresh on the new Redis would be.
    expect(copied).toMatchObject({ forgets: 1 });
    expect(seeded).toBe('1');
    expect(JSON.parse(String(await t.scopeRecord('f')))).toMatchObject({ forgets: 1 });
    expect(restored).toMatchObject({ restored: 0, forgotten: 1 });
    expect(await redis.get(forgetsKey(t.prefix, 'default', 'f'))).toBe('2');
  });

  it('registers a scope left out of a copy as too large: the sweep retires the records its older copies left', async () => {
    const t = await setup();
    const long = 'l'.repeat(200);
    const store = await learnBatch(redis, t.prefix, asAgent(long), LOW_BAR, TTL + GRACE);
    // Copied whole while its records fitted, and never registered (the TTL 0 then, or a version without the registry).
    const before = ruleCopier(redis, t.prefix, sink, t.topic).snapshots;
    before.mark(store.written());
    await before.flush();
    expect(await t.scopeRecord(long)).toBeTruthy();
    expect(await t.registered()).toEqual([]);
    // PAVER_MAX_OUTPUT_BYTES lowered under its scope record (its tombstone still fits): the copy leaves it out.
    const limit = messageBytes({ key: scopeRecordKey(t.prefix, 'default', long), value: null }) + 5;
    const tight = ruleCopier(redis, t.prefix, sink, t.topic, t.retirement, limit);
    tight.snapshots.mark(store.written());
    await tight.snapshots.flush();
    expect((await tight.metrics.records.get()).values).toEqual([
      expect.objectContaining({ labels: { kind: 'too_large' }, value: 1 }),
    ]);
    // Before, left out of the registry with it: never swept, its records on the topic for ever.
    expect(await t.registered()).toEqual([S(long)]);
    await t.idle(long);
    expect(await t.sweeper({ maxRecordBytes: limit }).sweep()).toEqual({ retired: 1, gone: 0, failed: 0 });
    expect(await t.scopeRecord(long)).toBeNull();
    await t.lose();
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 0 });
    expect(await readScope(redis, t.prefix, 'default', long)).toBeNull();
  });

  it("leaves out a retirement's tombstones over PAVER_MAX_OUTPUT_BYTES, which the topic would refuse with the whole round", async () => {
    const long = 'l'.repeat(200);
    // The scope record's tombstone fits; its record, and its contexts' tombstones (longer keys), do not.
    const t = await setup({
      limit: (prefix) => messageBytes({ key: scopeRecordKey(prefix, 'default', long), value: null }) + 5,
    });
    await t.learn(asAgent(long));
    await t.learn(asAgent('x'));
    expect(await t.registered()).toEqual([S(long), S('x')].sort());
    await t.idle(long);
    await t.idle('x');
    // Before, the broker refused the round's send at every sweep, the other scope's retirement with it.
    expect(await t.retirement.sweep()).toEqual({ retired: 2, gone: 0, failed: 0 });
    expect(await t.scopeRecord(long)).toBeNull();
    expect(await t.scopeRecord('x')).toBeNull();
    expect(await t.registered()).toEqual([]);
    // A forget's marker is held to the same limit: left out where it does not fit (the broker would refuse the
    // forget's whole send), sent where it does.
    expect(await t.retirement.forget('default', long)).toEqual({ state: false, contexts: 0 });
    expect(await t.retirement.forget('default', 'x')).toEqual({ state: false, contexts: 0 });
    const latest = await readLatest(rulesReplay(t.topic));
    expect(latest.has(forgetMarkerKey(t.prefix, 'default', long))).toBe(false);
    expect(JSON.parse(String(latest.get(forgetMarkerKey(t.prefix, 'default', 'x'))))).toMatchObject({
      v: 1,
      forgets: 1,
    });
  });

  it('a stop during a restore the sweep waits for is logged at info, not as a failed sweep', async () => {
    const prefix = unique('paver-test');
    const epochKey = `${prefix}:aseq:epoch`;
    let running = true;
    const logged: { level: number; msg: string }[] = [];
    const log = pino({ level: 'info' }, { write: (line: string) => logged.push(JSON.parse(line)) });
    // The service's guard over a real marker; its restore runs until the stop (a long rules topic).
    const guard = createStateGuard({
      epoch: createEpoch(redis, epochKey, restoreFlagKey(epochKey)),
      log,
      goOn: () => running,
      rebuild: (_reason, goOn) => whileGoingOn(goOn, new Promise<void>(() => undefined)),
    });
    const sweeper = new ScopeRetirement({
      redis,
      prefix,
      sink,
      topic: unique('autoseq-rules'),
      leaseMs: 10_000,
      graceMs: GRACE,
      log,
      paused: () => guard.rebuilding(),
      ensureState: () => guard.ensure(),
      epoch: { key: epochKey, flag: restoreFlagKey(epochKey), value: () => null },
      onRetired: () => undefined,
      recopy: () => undefined,
    });
    // The sweep is the first to find the marker missing (no batch comes): its own check starts the restore.
    sweeper.start(1_000);
    await waitFor(async () => guard.rebuilding(), 'the restore under way');
    running = false;
    await waitFor(async () => !guard.rebuilding(), 'the restore given up');
    await sweeper.stop();
    // Before, the sweep's wait for the restore ended in a warning, 'idle scope retirement failed', at every such stop.
    expect(logged.filter((l) => l.level >= 40)).toEqual([]);
    expect(logged.map((l) => l.msg)).toContain(
      'idle scope sweep: restore stopped by the shutdown; done again at the next start',
    );
  });

  it('PAVER_MAX_OUTPUT_BYTES lowered across a restart: the retirement ends without the tombstones that no longer fit, counted and warned once', async () => {
    const t = await setup();
    // Copied under the old limit (none here): every context record is on the topic.
    await t.learn(asAgent('x'));
    const ctxs = await t.topicCtxs('x');
    expect(ctxs.length).toBeGreaterThan(0);
    await t.idle('x');
    // The new limit: the scope record's tombstone fits, its contexts' (longer keys) do not.
    const limit = messageBytes({ key: scopeRecordKey(t.prefix, 'default', 'x'), value: null }) + 1;
    const over = ctxs.filter(
      (c) => messageBytes({ key: contextRecordKey(t.prefix, 'default', 'x', c), value: null }) > limit,
    ).length;
    expect(over).toBe(ctxs.length);
    const logged: { level: number; msg: string; tombstones?: number }[] = [];
    const log = pino({ level: 'warn' }, { write: (line: string) => logged.push(JSON.parse(line)) });
    const sweep = t.sweeper({ maxRecordBytes: limit, log });
    expect(await sweep.sweep()).toEqual({ retired: 1, gone: 0, failed: 0 });
    // Finished, not retried at every sweep: the names and the registry entry are gone.
    expect(await redis.exists(retiringKey(t.prefix, 'default', 'x'))).toBe(0);
    expect(await t.registered()).toEqual([]);
    expect(await sweep.sweep()).toEqual({ retired: 0, gone: 0, failed: 0 });
    expect(await t.scopeRecord('x')).toBeNull();
    // Before, they were left out silently: the records they leave on the topic were counted nowhere.
    expect(await t.sweptRecords('too_large')).toBe(over);
    const warned = logged.filter((l) => l.msg.includes('tombstones over PAVER_MAX_OUTPUT_BYTES'));
    expect(warned).toHaveLength(1);
    expect(warned[0]?.tombstones).toBe(over);
    // What stays is left out by a restore, with its tombstoned scope record.
    await t.lose();
    await t.newEpoch();
    expect(await t.restore()).toMatchObject({ restored: 0 });
  });

  it('copies a scope record marked again with no context (a retirement cut short on a scope that holds all its names)', async () => {
    const t = await setup();
    await t.learn(asAgent('x'));
    t.snapshots.mark([{ tenant: 'default', agent: 'x', ctxs: [] }]);
    await t.snapshots.flush();
    expect(await t.failedCopies()).toBe(0);
    await t.learn(asAgent('y'));
    expect(await t.failedCopies()).toBe(0);
    expect((await t.inTopic()).map((s) => s.split(':')[0])).toEqual(['x', 'y']);
  });
});

describe('paver run autoseq retires an idle scope (real Kafka and Redis)', () => {
  const redis = testRedis();
  const procs: Proc[] = [];
  afterAll(async () => {
    await killAll(procs);
    await redis.quit();
  });

  it('POST /rules/forget forgets a scope for good: after a Redis loss the restore leaves it out (TTL 0)', async () => {
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-forget', LOW_BAR)),
      AUTOSEQ_RULES_SNAPSHOT_MS: '200',
      AUTOSEQ_LEARN_SCOPE_TTL_MS: '0',
    };
    const prefix = env.REDIS_KEY_PREFIX!;
    const p = await startAutoseq(env, procs);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      [...events, ...asAgent('other')].map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
    );
    const rules = async (agent: string) => {
      const r = await getJson(p.url(`/rules?tenant_id=default&agent_id=${agent}`));
      expect(r.status).toBe(200);
      return (r.body as { rules: unknown[] }).rules;
    };
    const inTopic = async () =>
      (await readRulesLog(rulesReplay(env.AUTOSEQ_RULES_TOPIC!), prefix)).scopes.map((s) => s.agent).sort();
    await waitFor(async () => (await inTopic()).length === 2, 'both scopes copied to the rules topic');
    await waitFor(
      async () => (await rules('default')).length > 0 && (await rules('other')).length > 0,
      'rules learned in both scopes',
    );
    const forget = (query: string) => fetch(p.url(`/rules/forget?${query}`), { method: 'POST' });
    expect((await forget('tenant_id=default')).status).toBe(400);
    const r = await forget('tenant_id=default&agent_id=default');
    expect(r.status).toBe(200);
    expect(await r.json()).toMatchObject({
      tenant_id: 'default',
      agent_id: 'default',
      forgotten: true,
      had_state: true,
    });
    expect(await rules('default')).toEqual([]);
    expect(await inTopic()).toEqual(['other']);
    // Its forget marker is on the topic, counted among the copy's records.
    const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    expect(metrics.value('paver_autoseq_rules_snapshot_records_total', { kind: 'forget_marker' })).toBe(1);

    // Redis loses the service's state; the next read waits for the restore from the rules topic.
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.del(...keys);
    } while (cursor !== '0');
    expect((await rules('other')).length).toBeGreaterThan(0);
    expect(await rules('default')).toEqual([]);
    expect(await redis.exists(learnKey(prefix, 'default', 'default'))).toBe(0);
    expect(await stopPromptly(p)).toBe(0);
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
    const inTopic = async () => (await readRulesLog(rulesReplay(env.AUTOSEQ_RULES_TOPIC!), prefix)).scopes;
    // The copy registers the scope while its records are sent (both settle before its leases go): the
    // registration may be seen first.
    await waitFor(async () => (await inTopic()).length === 1, "the scope's copy on the rules topic");

    const metric = (outcome: string) => retiredCount(p, outcome);
    // Retired by the sweep (both steps done), not dropped by Redis's expiry at the end of the grace.
    await waitFor(async () => (await metric('retired')) === 1, 'the idle scope retired', 150_000);
    expect(await metric('gone')).toBe(0);
    expect(await redis.exists(key)).toBe(0);
    expect(await redis.scard(scopeRegistryKey(prefix))).toBe(0);
    expect(await inTopic()).toEqual([]);
    expect(await stopPromptly(p)).toBe(0);
  });

  it('retires an idle scope whose epoch marker went while no batch came: the sweep checks the epoch itself', async () => {
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-retire-marker', LOW_BAR)),
      AUTOSEQ_RULES_SNAPSHOT_MS: '200',
      AUTOSEQ_LEARN_SCOPE_TTL_MS: '60000',
    };
    const prefix = env.REDIS_KEY_PREFIX!;
    const key = learnKey(prefix, 'default', 'default');
    const p = await startAutoseq(env, procs);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      events.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
    );
    const inTopic = async () => (await readRulesLog(rulesReplay(env.AUTOSEQ_RULES_TOPIC!), prefix)).scopes;
    await waitFor(
      async () =>
        (await redis.sismember(scopeRegistryKey(prefix), JSON.stringify(['default', 'default']))) === 1 &&
        (await inTopic()).length === 1,
      'the scope registered and copied',
    );
    // The marker evicted (the state stays), and no batch after it: only the sweep can see it. Before, the sweep
    // waited for the guard to see a new marker, which only a batch (or a /readyz probe) made it do: the scope's
    // state was deleted by the retirement's first step and its tombstones never sent, for good.
    await redis.del(`${prefix}:aseq:epoch`);
    const metric = (outcome: string) => retiredCount(p, outcome);
    await waitFor(async () => (await metric('retired')) === 1, 'the idle scope retired', 150_000);
    expect(await redis.exists(key)).toBe(0);
    expect(await redis.scard(scopeRegistryKey(prefix))).toBe(0);
    expect(await inTopic()).toEqual([]);
    expect(await stopPromptly(p)).toBe(0);
  });
});
