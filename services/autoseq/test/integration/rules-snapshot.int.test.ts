import { pino } from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { messageBytes } from '../../../../shared/kafka/dead-letter.js';
import { readLatest } from '../../../../shared/kafka/replay.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { rng } from '../../../../testkit/streams.js';
import {
  contextRecordKey,
  contextRecordValue,
  readRulesLog,
  scopeRecordKey,
  scopeRecordValue,
} from '../../src/adapters/kafka/rules-log.js';
import { learnKey, metaCopy, readContexts, readScope } from '../../src/adapters/redis/learn-store.js';
import { restoreCutShort } from '../../../../shared/redis/rebuild.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { restoreRules } from '../../src/adapters/rules-snapshot.js';
import { learnBatch, ruleCopier, rulesReplay } from './rule-copies.js';
import { fixtureEvents } from '../learn-streams.js';
import { LOW_BAR } from './predict-compare.js';

const events = fixtureEvents();

describe('learned rules copied to a compacted topic and restored from it (real Kafka and Redis)', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });

  it('the copy of every batch written (evictions as tombstones) restores the scope exactly, once, and never over newer state', async () => {
    const prefix = unique('paver-test');
    const flag = restoreFlagKey(`${prefix}:aseq:epoch`);
    const topic = unique('autoseq-rules');
    await createTopics([{ topic, partitions: 3, compacted: true }]);
    await sink.connect();
    const { snapshots, metrics } = ruleCopier(redis, prefix, sink, topic);
    const replay = rulesReplay(topic);

    // Small bounds (LOW_BAR): eviction deletes contexts many times over the fixture. Copies are made after a
    // random number of batches, so some contexts change several times between two copies.
    const random = rng(3);
    let i = 0;
    while (i < events.length) {
      const batch = events.slice(i, i + 1 + Math.floor(random() * 30));
      i += batch.length;
      const store = await learnBatch(redis, prefix, batch, LOW_BAR, 0);
      snapshots.mark(store.written());
      if (random() < 0.3) await snapshots.flush();
    }
    await snapshots.stop();
    expect(snapshots.pending()).toBe(0);
    const counts = (kind: string) =>
      metrics.records.get().then((v) => v.values.find((x) => x.labels.kind === kind)?.value ?? 0);
    expect(await counts('context')).toBeGreaterThan(0);
    expect(await counts('tombstone')).toBeGreaterThan(0);

    const learned = await readScope(redis, prefix, 'default', 'default');
    expect(learned!.nActive).toBeGreaterThan(0);

    // Redis loses the scope: the topic gives it back as it was.
    await redis.del(learnKey(prefix, 'default', 'default'));
    expect(await readScope(redis, prefix, 'default', 'default')).toBeNull();
    const first = await restoreRules(redis, prefix, flag, replay);
    expect(first).toMatchObject({ scopes: 1, restored: 1, skipped: 0 });
    expect(first.contexts).toBe(Object.keys(learned!.ctx).length);
    expect(await readScope(redis, prefix, 'default', 'default')).toEqual(learned);
    expect(await restoreCutShort(redis, flag)).toBe(false);

    // Run again (another instance noticed the loss too), or after the scope moved on: nothing is overwritten.
    const more = events
      .slice(0, 40)
      .map((e) => ({ ...e, task_id: `again-${e.task_id}`, event_id: `again-${e.event_id}` }));
    await learnBatch(redis, prefix, more, LOW_BAR, 0);
    const moved = await readScope(redis, prefix, 'default', 'default');
    expect(moved!.clock).toBeGreaterThan(learned!.clock);
    expect(await restoreRules(redis, prefix, flag, replay)).toMatchObject({ scopes: 1, restored: 0 });
    expect(await readScope(redis, prefix, 'default', 'default')).toEqual(moved);

    // Another deployment's prefix on the same topic is not this one's.
    expect(await restoreRules(redis, unique('other'), flag, replay)).toMatchObject({
      scopes: 0,
      restored: 0,
    });
    await redis.del(learnKey(prefix, 'default', 'default'));
  });

  /**
   * A prefix, a rules topic whose max.message.bytes is `limit`, and a sink and copier held to the same
   * PAVER_MAX_OUTPUT_BYTES, as a deployment whose topic limit is the service's.
   */
  async function limited(limit: number) {
    const prefix = unique('paver-test');
    const topic = unique('autoseq-rules');
    await createTopics([
      { topic, partitions: 1, compacted: true, config: { 'max.message.bytes': String(limit) } },
    ]);
    const small = createSink(testKafka(), jsonCodec(), undefined, { maxRecordBytes: limit });
    await small.connect();
    // The warnings logged, by message.
    const logged: string[] = [];
    const log = pino({ level: 'warn' }, { write: (line: string) => logged.push(JSON.parse(line).msg) });
    const { snapshots, metrics } = ruleCopier(redis, prefix, small, topic, undefined, limit, log);
    const count = async (
      c: { get(): Promise<{ values: { labels: Record<string, unknown>; value: number }[] }> },
      label: string,
    ) => (await c.get()).values.find((v) => Object.values(v.labels).includes(label))?.value ?? 0;
    return {
      prefix,
      topic,
      snapshots,
      records: (kind: string) => count(metrics.records, kind),
      flushes: (outcome: string) => count(metrics.flushes, outcome),
      warnings: (part: string) => logged.filter((m) => m.includes(part)).length,
      close: () => small.disconnect(),
    };
  }

  /** A scope learned (not copied) under `prefix`, and its records as a copy builds them, with their sizes. */
  async function learned(prefix: string, agent: string, opts = LOW_BAR) {
    const batch = events.map((e) => ({ ...e, agent_id: agent }));
    const store = await learnBatch(redis, prefix, batch, opts, 0);
    const [copy] = await readContexts(redis, prefix, store.written());
    const meta = metaCopy(copy!.meta!)!;
    const key = scopeRecordKey(prefix, 'default', agent);
    const scope = (fam: typeof meta.fam) =>
      messageBytes({ key, value: scopeRecordValue(meta.clock, fam, Date.now()) });
    const ctxs = [...copy!.ctxs].flatMap(([ctx, stored]) => {
      if (stored === null) return [];
      const k = contextRecordKey(prefix, 'default', agent, ctx);
      const v = contextRecordValue(stored);
      return [
        {
          ctx,
          keyValue: Buffer.byteLength(k) + Buffer.byteLength(v),
          broker: messageBytes({ key: k, value: v }),
        },
      ];
    });
    const tombstones = [...copy!.ctxs.keys()].map((ctx) =>
      messageBytes({ key: contextRecordKey(prefix, 'default', agent, ctx), value: null }),
    );
    return { store, meta, tombstones, scopeBytes: scope(meta.fam), bareScopeBytes: scope(undefined), ctxs };
  }

  it('sizes a context record as the broker counts it: one that fits by key and value alone is left out, not refused with the whole copy', async () => {
    // No families' evidence: the scope record stays small, and only the contexts meet the limit.
    const probe = await learned(unique('probe'), 'default', { ...LOW_BAR, familyTrials: 0 });
    expect(probe.meta.fam).toBeUndefined();
    // The limit is the largest context's key and value: with its framing that context is over it.
    const limit = Math.max(...probe.ctxs.map((c) => c.keyValue));
    expect(probe.scopeBytes).toBeLessThanOrEqual(limit);
    const over = probe.ctxs.filter((c) => c.broker > limit);
    expect(over.length).toBeGreaterThan(0);
    expect(over.length).toBeLessThan(probe.ctxs.length);

    const t = await limited(limit);
    const l = await learned(t.prefix, 'default', { ...LOW_BAR, familyTrials: 0 });
    t.snapshots.mark(l.store.written());
    await t.snapshots.flush();
    expect(await t.flushes('failed')).toBe(0);
    expect(await t.flushes('ok')).toBe(1);
    expect(t.snapshots.pending()).toBe(0);
    expect(await t.records('too_large')).toBe(over.length);
    expect(await t.records('context')).toBe(l.ctxs.length - over.length);

    // Redis loses the scope: the topic gives back every context that fitted, the scope's clock with them.
    await redis.del(learnKey(t.prefix, 'default', 'default'));
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    expect(await restoreRules(redis, t.prefix, flag, rulesReplay(t.topic))).toMatchObject({
      restored: 1,
      contexts: l.ctxs.length - over.length,
    });
    const back = await readScope(redis, t.prefix, 'default', 'default');
    expect(Object.keys(back!.ctx).sort()).toEqual(
      l.ctxs
        .filter((c) => c.broker <= limit)
        .map((c) => c.ctx)
        .sort(),
    );
    await redis.del(learnKey(t.prefix, 'default', 'default'));
    await t.close();
  });

  it("copies a scope record over the limit without its families' evidence; leaves out a scope whose record cannot fit at all, and tombstones whose key cannot; the others of the round go on", async () => {
    const longAgent = 'a'.repeat(200);
    const probe = await learned(unique('probe'), 'default');
    expect(probe.meta.fam).toBeDefined();
    // The default scope's record fits only without its families; the long-named scope's does not fit at all;
    // no context fits, nor do the tombstones of the longest keys.
    const limit = probe.bareScopeBytes + 20;
    expect(probe.scopeBytes).toBeGreaterThan(limit);
    expect(Math.min(...probe.ctxs.map((c) => c.broker))).toBeGreaterThan(limit);
    expect(Math.max(...probe.tombstones)).toBeGreaterThan(limit);

    const t = await limited(limit);
    const a = await learned(t.prefix, 'default');
    const b = await learned(t.prefix, longAgent);
    expect(b.bareScopeBytes).toBeGreaterThan(limit);
    t.snapshots.mark([...a.store.written(), ...b.store.written()]);
    await t.snapshots.flush();
    expect(await t.flushes('failed')).toBe(0);
    expect(t.snapshots.pending()).toBe(0);
    expect(await t.records('trimmed')).toBe(1);
    // Each context of the default scope (tombstoned in its place when its key fits), evicted contexts whose
    // tombstone cannot fit, and the long-named scope.
    const evictedOver = a.tombstones.length - a.ctxs.length - (await t.records('tombstone'));
    expect(await t.records('too_large')).toBe(a.ctxs.length + evictedOver + 1);
    expect(await t.records('context')).toBe(0);
    expect(t.warnings("copied without its families' evidence")).toBe(1);
    expect(t.warnings('the scope is left out')).toBe(1);
    // Copied again, as a scope that keeps learning is at every interval: counted every time, warned once per
    // scope (before, a warning at every interval).
    t.snapshots.mark([...a.store.written(), ...b.store.written()]);
    await t.snapshots.flush();
    expect(await t.records('trimmed')).toBe(2);
    expect(t.warnings("copied without its families' evidence")).toBe(1);
    expect(t.warnings('the scope is left out')).toBe(1);

    const latest = await readLatest(rulesReplay(t.topic));
    expect(latest.has(scopeRecordKey(t.prefix, 'default', longAgent))).toBe(false);
    const onTopic = (await readRulesLog(rulesReplay(t.topic), t.prefix)).scopes;
    expect(onTopic.map((s) => s.agent)).toEqual(['default']);
    expect(onTopic[0]!.clock).toBe(a.meta.clock);
    expect(onTopic[0]!.fam).toBeUndefined();

    // A restore brings the scope back with its clock, its families to learn again.
    await redis.del(learnKey(t.prefix, 'default', 'default'), learnKey(t.prefix, 'default', longAgent));
    const flag = restoreFlagKey(`${t.prefix}:aseq:epoch`);
    expect(await restoreRules(redis, t.prefix, flag, rulesReplay(t.topic))).toMatchObject({ restored: 1 });
    const back = await readScope(redis, t.prefix, 'default', 'default');
    expect(back!.clock).toBe(a.meta.clock);
    expect(await readScope(redis, t.prefix, 'default', longAgent)).toBeNull();
    await redis.del(learnKey(t.prefix, 'default', 'default'));
    await t.close();
  });
});
