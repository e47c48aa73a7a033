import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createEpoch } from '../../../../shared/redis/epoch.js';
import { testKafka } from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../../../../test/helpers/own-redis.js';
import { createDetectorMetrics } from '../../src/adapters/metrics.js';
import { detectorGlobalKeys, detectorKeys, REGISTRIES_COMPLETE } from '../../src/adapters/redis/store.js';
import type { DetectorOp, Scope } from '../../src/core/ops.js';
import { scopeStore, threeRuns } from './scope-fixture.js';

/*
 * The once-a-minute sweep found the per-partition scope registries with SCAN MATCH over the whole keyspace:
 * on a Redis shared with millions of keys (the detector's own window keys among them), thousands of round trips
 * a minute per instance for a handful of registries, and none of them counted in
 * paver_detector_redis_round_trips_total. Now the registries are listed in an index written with them, and SCAN
 * runs once, for registries an earlier version wrote without the index. The epoch marker read before each scope
 * the service's sweep acts on rides, where it can, on the round trip made just before (it was a GET of its own).
 * These tests run on a Redis of their own, filled with unrelated keys, whose command statistics say what the sweep
 * really sent.
 */

const UNRELATED = 30_000;
const HOUR = 3_600_000;
const sink = createSink(testKafka(), jsonCodec());
let redis: Redis;

beforeAll(async () => {
  redis = new Redis((await ownRedis()).url, { maxRetriesPerRequest: 2 });
  // Keys of another tenant of the same Redis, by one script call per 10,000.
  for (let from = 0; from < UNRELATED; from += 10_000)
    await redis.eval("for i = ARGV[1], ARGV[1] + 9999 do redis.call('SET', 'other:' .. i, 'x') end", 0, from);
});
afterAll(async () => {
  await sink.disconnect();
  redis.disconnect();
  stopOwnRedis();
});

/** Calls per command since the last `CONFIG RESETSTAT`, from the server's own statistics. */
async function commandCalls(): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const m of (await redis.info('commandstats')).matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm))
    out.set(m[1]!, Number(m[2]));
  return out;
}
const total = (calls: Map<string, number>) => [...calls.values()].reduce((a, b) => a + b, 0);

/** threeRuns for another scope and partition. */
const runsOf = (s: Scope, partition: number): DetectorOp[] =>
  threeRuns().map((op) => ({ ...op, scope: s, partition }));
const scopes: Scope[] = [0, 1, 2, 3, 4, 5].map((i) => ({ tenant: 'acme', agent: `a${i}` }));

async function setup() {
  const base = await scopeStore({ redis, sink }, 'det-sweep-index');
  const recovered: string[] = [];
  const retired: string[] = [];
  const publisher = base.publisher({
    scopeTtlMs: HOUR,
    onRecovered: (via) => recovered.push(via),
    onRetired: (o) => retired.push(o),
  });
  const registry = new Registry();
  createDetectorMetrics(registry, base.store);
  const counted = async () =>
    (await registry.getSingleMetric('paver_detector_redis_round_trips_total')!.get()).values[0]?.value ?? 0;
  const global = detectorGlobalKeys(base.prefix);
  /**
   * A change of the scope owed for a minute: abandoned (a publication may take 1 s here). Scopes are published
   * first, so that only these are, however slowly the test runs.
   */
  const abandon = async (s: Scope) => {
    const [sec] = await redis.time();
    await redis.hset(detectorKeys(base.prefix, s).meta, 'owed', 1, 'owedAt', Number(sec) * 1000 - 60_000);
  };
  /** The scope's last apply over an hour ago: idle for the TTL. */
  const ageSeen = async (s: Scope) => {
    const [sec] = await redis.time();
    await redis.hset(detectorKeys(base.prefix, s).meta, 'seenAt', Number(sec) * 1000 - HOUR - 60_000);
  };
  /** One sweep: the round trips it counted, and the commands the server ran meanwhile. */
  const sweep = async (p = publisher) => {
    await redis.config('RESETSTAT');
    const before = base.store.roundTrips;
    await p.sweep();
    const calls = await commandCalls();
    // The statistics' own reset and read.
    calls.delete('config|resetstat');
    calls.delete('info');
    return { trips: base.store.roundTrips - before, calls };
  };
  return {
    ...base,
    publisher,
    publisherWith: base.publisher,
    recovered,
    retired,
    counted,
    global,
    abandon,
    ageSeen,
    sweep,
  };
}

describe('detector: the sweep finds the scope registries without scanning the keyspace', () => {
  it('reads them through their index: a fixed number of round trips, whatever else Redis holds', async () => {
    const { store, publisher, counted, global, sweep } = await setup();
    for (const [i, s] of scopes.entries()) {
      await store.applyBatch(runsOf(s, i % 3));
      await publisher.publish(s, true);
    }
    expect((await redis.smembers(global.registries)).sort()).toEqual(['0', '1', '2']);

    // The first sweep of a key prefix cannot tell an earlier version's registries (no index) from none: it
    // looks once.
    const first = await sweep();
    expect(first.calls.get('scan')).toBeGreaterThanOrEqual(UNRELATED / 1_000);
    expect(await redis.smembers(global.registries)).toContain(REGISTRIES_COMPLETE);

    // From then on: the index, one page of the three registries, the owed marks (with Redis's time).
    const next = await sweep();
    expect(next.calls.get('scan')).toBeUndefined();
    expect(next.trips).toBe(3);
    // SMEMBERS, 3 SSCAN, TIME, 6 HMGET.
    expect(total(next.calls)).toBe(11);
    expect(await counted()).toBe(store.roundTrips);
    await publisher.close();
  });

  it('counts every SCAN page of the one look for an earlier version’s registries, and sweeps their scopes', async () => {
    const { store, publisher, recovered, retired, counted, global, abandon, ageSeen, sweep } = await setup();
    const [owed, idle] = [scopes[0]!, scopes[1]!];
    for (const [s, p] of [
      [owed, 0],
      [idle, 2],
    ] as const) {
      await store.applyBatch(runsOf(s, p));
      await publisher.publish(s, true);
    }
    // What an earlier version left: registries, and no index.
    await redis.del(global.registries);
    await abandon(owed);
    await ageSeen(idle);

    const upgrade = await sweep();
    expect(recovered).toEqual(['sweep']);
    expect(retired).toEqual(['retired']);
    const scans = upgrade.calls.get('scan') ?? 0;
    expect(scans).toBeGreaterThanOrEqual(UNRELATED / 1_000);
    // Every page counted, with the index read, its completion, the registries, the marks, the recovered
    // publication (claim, release) and the retirement (claim, finish, registry removal).
    expect(upgrade.trips).toBe(scans + 4 + 2 + 3);
    expect((await redis.smembers(global.registries)).sort()).toEqual(['0', '2', REGISTRIES_COMPLETE]);
    expect(await counted()).toBe(store.roundTrips);

    // Looked for once: the next sweep reads the index.
    const next = await sweep();
    expect(next.calls.get('scan')).toBeUndefined();
    expect(next.trips).toBe(3);
    await publisher.close();
  });

  it('after a Redis loss, the rebuild’s writes index the registries again, and the sweep finds its scopes', async () => {
    const {
      prefix,
      store,
      publisher: plain,
      publisherWith,
      recovered,
      global,
      abandon,
      sweep,
    } = await setup();
    const s = scopes[2]!;
    const epoch = createEpoch(redis, global.epoch);
    const { epoch: e1 } = await epoch.check();
    await store.markRebuilt(1, e1);
    expect((await store.applyBatch(runsOf(s, 1), { epoch: e1 })).lost).toBe(false);
    await plain.publish(s, true);
    await sweep();
    expect(await redis.smembers(global.registries)).toContain(REGISTRIES_COMPLETE);

    // Every detector key lost (only this test's: the unrelated ones stay).
    await redis.eval(
      "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
      0,
      `${prefix}:*`,
    );
    store.forgetScopes();
    // Partition 1 rebuilt under a new epoch: its replay registers the scope, and indexes its registry.
    const { epoch: e2 } = await epoch.check();
    expect((await store.applyBatch(runsOf(s, 1), { epoch: e2, mode: 'r' })).lost).toBe(false);
    await store.markRebuilt(1, e2);
    expect(await redis.smembers(global.registries)).toEqual(['1']);

    // The rebuild's change left owed (its instance died before publishing): the service's sweep finds it.
    await abandon(s);
    const gated = publisherWith({ sweepRebuiltOnly: true, onRecovered: (via) => recovered.push(via) });
    await sweep(gated);
    expect(recovered).toEqual(['sweep']);
    expect((await redis.smembers(global.registries)).sort()).toEqual(['1', REGISTRIES_COMPLETE]);
    const next = await sweep(gated);
    expect(next.calls.get('scan')).toBeUndefined();
    expect(next.trips).toBe(3);
    await gated.close();
    await plain.close();
  });

  it('reads the epoch marker before each scope it acts on, the first one’s in its scan', async () => {
    const { store, publisher, publisherWith, recovered, global, abandon, sweep } = await setup();
    const epoch = createEpoch(redis, global.epoch);
    const { epoch: e } = await epoch.check();
    await store.markRebuilt(0, e);
    const [a, b] = [scopes[3]!, scopes[4]!];
    for (const s of [a, b]) {
      expect((await store.applyBatch(runsOf(s, 0), { epoch: e })).lost).toBe(false);
      await publisher.publish(s, true);
    }
    // The one look for registries without an index, out of the way.
    await sweep();
    await abandon(a);
    await abandon(b);

    // The first scope's publication sees the marker go (a loss meanwhile): the second is not acted on.
    const gated = publisherWith({
      sweepRebuiltOnly: true,
      onRecovered: (via) => {
        recovered.push(via);
        void redis.del(global.epoch);
      },
    });
    const { trips } = await sweep(gated);
    expect(recovered).toEqual(['sweep']);
    expect([await store.isOwed(a), await store.isOwed(b)].sort()).toEqual([false, true]);
    // The index, the registries, the marks (which read the marker last), the first scope's publication (claim,
    // release), and a read of the marker before the second scope: none of its own before the first.
    expect(trips).toBe(3 + 2 + 1);
    await gated.close();
    await publisher.close();
  });

  it('reads the epoch marker before each scope it retires in the last round trip of the one before', async () => {
    const { prefix, store, publisher, publisherWith, retired, global, ageSeen, sweep } = await setup();
    const epoch = createEpoch(redis, global.epoch);
    const { epoch: e } = await epoch.check();
    await store.markRebuilt(0, e);
    const [a, b] = [scopes[3]!, scopes[4]!];
    for (const s of [a, b]) {
      expect((await store.applyBatch(runsOf(s, 0), { epoch: e })).lost).toBe(false);
      await publisher.publish(s, true);
    }
    await sweep();
    await ageSeen(a);
    await ageSeen(b);

    // The marker goes while the first scope's retractions are sent (a loss meanwhile): the second is not retired.
    const gated = publisherWith({
      sweepRebuiltOnly: true,
      scopeTtlMs: HOUR,
      onRetired: (o) => retired.push(o),
      onPublished: (status) => {
        if (status === 'retracted') void redis.del(global.epoch);
      },
    });
    const { trips } = await sweep(gated);
    expect(retired).toEqual(['retired']);
    const kept = await Promise.all([a, b].map((s) => redis.exists(detectorKeys(prefix, s).meta)));
    expect(kept.sort()).toEqual([0, 1]);
    // The index, the registries, the marks, and the first scope's retirement (claim, finish, registry removal):
    // the marker read in the scan's last round trip and in the retirement's, no GET of its own.
    expect(trips).toBe(3 + 3);
    await gated.close();
    await publisher.close();
  });
});
