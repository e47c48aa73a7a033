import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  consumeUntil,
  groupCaughtUp,
  produce,
  testRedis,
  waitFor,
  type Consumed,
} from '../../../../test/helpers/kafka.js';
import {
  explained,
  getJson,
  killAll,
  serviceEnv,
  stopPromptly,
  type Proc,
} from '../../../../test/helpers/process.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { silentLogger } from '../../../../shared/log.js';
import { testKafka } from '../../../../test/helpers/kafka.js';
import { ScopePublisher } from '../../src/adapters/publisher.js';
import { detectorGlobalKeys, detectorKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import { candidateKey } from '../../src/core/candidate.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';
import { detectorTopics, metrics, startDetector } from './backlog.js';

/*
 * After a Redis loss, a partition was rebuilt only when a batch of it came. One with no traffic stayed without
 * state: its scopes' candidates gone from /candidates, and, since the sweep acts only on scopes rebuilt in the
 * current epoch, its idle scopes never retired. Now the detector rebuilds every partition it owns that is not
 * rebuilt in the current epoch: when a check of the epoch finds it changed (a batch of another partition), at
 * a join (a start after the loss), and once a minute. Here one scope's events are all on partition 0 (quiet
 * after the loss), another's on partition 1.
 */

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
const procs: Proc[] = [];
afterEach(() => killAll(procs));
afterAll(async () => {
  await sink.disconnect();
  redis.disconnect();
});

const HOUR = 3_600_000;
const quiet = { tenant: 'default', agent: 'quiet' };
const busy = { tenant: 'default', agent: 'busy' };

/** Three tasks of `tools` in `scope`, each ended by its task_completed, all on `partition`. */
function tasks(scope: typeof quiet, tools: string[], partition: number, suffix: string) {
  const t0 = Date.now();
  return ['1', '2', '3'].flatMap((n, i) => {
    const task = `${scope.agent}-${suffix}-${n}`;
    const base = {
      tenant_id: scope.tenant,
      agent_id: scope.agent,
      session_id: `s-${task}`,
      task_id: task,
    };
    const ts = t0 + i * 100;
    return [
      ...tools.map((tool, step) => ({
        ...base,
        type: 'tool_call',
        event_id: `${task}:${step}`,
        step,
        tool,
        ts: ts + step,
      })),
      { ...base, type: 'task_completed', event_id: `${task}:done`, ts: ts + 50 },
    ].map((e) => ({ key: e.session_id, value: JSON.stringify(e), partition }));
  });
}

/** Deletes every key under the prefix at once, as FLUSHALL does, but only this test's keys. */
const flushPrefix = async (prefix: string) =>
  Number(
    await redis.eval(
      "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do n = n + redis.call('DEL', k) end return n",
      0,
      `${prefix}:*`,
    ),
  );

const candidatesOf = async (p: Proc, s: typeof quiet) =>
  (await getJson(p.url(`/candidates?tenant_id=${s.tenant}&agent_id=${s.agent}`))).body as {
    dedupe_key: string;
  }[];

/** The latest record per key on the candidates topic. */
const latest = (all: Consumed[]) => {
  const m = new Map<string, { status: string; dedupe_key: string; agent_id: string }>();
  for (const r of all) if (r.key && r.value) m.set(r.key, JSON.parse(r.value.toString()));
  return m;
};

/** A detector over two partitions that has read and committed both scopes' tasks, with their candidates live. */
async function detectorWithBothScopes() {
  const env = serviceEnv({ DETECTOR_CHECKPOINT_INTERVAL_MS: '0' });
  await detectorTopics(env, 2);
  const prefix = env.REDIS_KEY_PREFIX!;
  const global = detectorGlobalKeys(prefix);
  await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
    ...tasks(quiet, ['lookup', 'check', 'close'], 0, 'a'),
    ...tasks(busy, ['search', 'book', 'pay'], 1, 'a'),
  ]);
  const p = await startDetector(env, procs);
  await explained(
    p,
    waitFor(
      async () =>
        (await candidatesOf(p, quiet)).length === 1 &&
        (await candidatesOf(p, busy)).length === 1 &&
        (await groupCaughtUp(env.DETECTOR_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!)),
      'both scopes detected and committed',
    ),
  );
  const before = await candidatesOf(p, quiet);
  /** Partition 0 is marked rebuilt under the marker Redis holds now (null while not). */
  const quietRebuilt = async () => {
    const [marker, mark] = await Promise.all([redis.get(global.epoch), redis.hget(global.rebuilt, '0')]);
    return marker !== null && mark === marker ? marker : null;
  };
  expect(await quietRebuilt()).not.toBeNull();
  return { env, prefix, p, before, quietRebuilt };
}

describe('detector: partitions with no traffic are rebuilt after a Redis loss (real Kafka, real Redis)', () => {
  it('rebuilds the quiet partition when a batch of another one finds the loss, and its idle scope is then retired', async () => {
    const { env, prefix, p, before, quietRebuilt } = await detectorWithBothScopes();
    const rebuiltBefore = (await metrics(p)).value('paver_detector_rebuilds_total', { outcome: 'rebuilt' });

    expect(await flushPrefix(prefix)).toBeGreaterThan(0);
    // Traffic on partition 1 only: its batch finds the loss.
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, tasks(busy, ['search', 'book', 'pay'], 1, 'b'));

    const epoch = await explained(p, waitFor(quietRebuilt, 'partition 0 rebuilt in the new epoch'));
    await explained(
      p,
      waitFor(
        async () => JSON.stringify(await candidatesOf(p, quiet)) === JSON.stringify(before),
        "the quiet scope's candidates back",
      ),
    );
    const m = await metrics(p);
    expect(m.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' })).toBeGreaterThanOrEqual(
      rebuiltBefore + 2,
    );
    expect(m.value('paver_detector_rebuilds_total', { outcome: 'failed' })).toBe(0);
    expect(p.output()).toMatch(/"trigger":"proactive"[^\n]*detector partition state rebuilt from Kafka/);
    // The topic holds the quiet candidate as active (any retraction in between was the publication of a scope
    // restored from the topic before its partition was rebuilt, put right by the rebuild's publication).
    const key = candidateKey(quiet, before[0]!.dedupe_key);
    await consumeUntil(env.PAVER_TOPIC_FLOW_CANDIDATES!, (all) => latest(all).get(key)?.status === 'active');

    // Its scope idle for an hour: the sweep, as the service runs it (only scopes rebuilt in this epoch), retires
    // it. Before, the scope had no state and no registration after the loss: nothing to retire.
    const store = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix);
    const [sec] = await redis.time();
    await redis.hset(detectorKeys(prefix, quiet).meta, 'seenAt', Number(sec) * 1000 - HOUR - 60_000);
    await sink.connect();
    const retired: string[] = [];
    const sweeper = new ScopePublisher({
      store,
      sink,
      topic: env.PAVER_TOPIC_FLOW_CANDIDATES!,
      params: DEFAULT_PARAMS,
      log: silentLogger(),
      onPublished: () => undefined,
      scopeTtlMs: HOUR,
      sweepRebuiltOnly: true,
      onRetired: (o) => retired.push(o),
    });
    expect(await redis.get(detectorGlobalKeys(prefix).epoch)).toBe(epoch);
    await sweeper.sweep();
    await sweeper.close();
    expect(retired).toEqual(['retired']);
    await consumeUntil(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      (all) => latest(all).get(key)?.status === 'retracted',
    );
    expect(await redis.exists(detectorKeys(prefix, quiet).meta)).toBe(0);
    // The busy scope is not idle: kept.
    expect(await candidatesOf(p, busy)).toHaveLength(1);
    expect(await candidatesOf(p, quiet)).toEqual([]);
  }, 240_000);

  it('a detector started after the loss rebuilds the partitions it owns, with no traffic at all', async () => {
    const { env, prefix, p, before, quietRebuilt } = await detectorWithBothScopes();
    expect(await stopPromptly(p)).toBe(0);
    expect(await flushPrefix(prefix)).toBeGreaterThan(0);

    const again = await startDetector(env, procs);
    await explained(again, waitFor(quietRebuilt, 'partition 0 rebuilt in the new epoch'));
    await explained(
      again,
      waitFor(
        async () =>
          JSON.stringify(await candidatesOf(again, quiet)) === JSON.stringify(before) &&
          (await candidatesOf(again, busy)).length === 1,
        "both scopes' candidates back",
      ),
    );
    expect(await redis.hget(detectorGlobalKeys(prefix).rebuilt, '1')).toBe(
      await redis.get(detectorGlobalKeys(prefix).epoch),
    );
    expect(again.output()).toContain('"trigger":"proactive"');
  }, 240_000);
});
