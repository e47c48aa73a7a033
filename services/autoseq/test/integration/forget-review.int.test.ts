import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink, type Sink } from '../../../../shared/kafka/sink.js';
import { silentLogger } from '../../../../shared/log.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { readRulesLog } from '../../src/adapters/kafka/rules-log.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { forgetMarkerKey, forgetMarkerValue } from '../../src/adapters/kafka/rules-log.js';
import { forgetsKey, learnKey } from '../../src/adapters/redis/learn-store.js';
import { leaseKey } from '../../src/adapters/redis/scope-lease.js';
import { restoreRules } from '../../src/adapters/rules-snapshot.js';
import { ScopeRetirement } from '../../src/adapters/scope-retire.js';
import { fixtureEvents } from '../learn-streams.js';
import { LOW_BAR } from './predict-compare.js';
import { learnBatch, ruleCopier, rulesReplay, stalledAcrossForget } from './rule-copies.js';

/*
 * Review of the forget marker (session 30). Context records carried no forget generation: the marker kept a scope
 * out only while the scope's own record was the stale copy's. Once the scope was learned again after the forget
 * and copied (its scope record then carrying the forget's generation), a context record the stale copy left on the
 * topic (one the relearned scope does not hold again) was restored with it: a forgotten rule came back. Each context
 * record now carries the generation its copy read, and a restore writes back only those at the marker's or above
 * (the first two tests failed before). The third: a marker gone backwards (a stalled forget's lower one landing
 * last) is made up for by the generation Redis kept (failed before).
 */

const events = fixtureEvents();
const asAgent = (agent: string, again = ''): ToolCallsEvent[] =>
  events.map((e) => ({
    ...e,
    agent_id: agent,
    event_id: e.event_id + again,
    ...(e.task_id === undefined ? {} : { task_id: e.task_id + again }),
  }));
/** The first task's events only: a scope learned again from less than before holds fewer contexts. */
const firstTask = (batch: ToolCallsEvent[]) => batch.filter((e) => e.task_id === batch[0]!.task_id);

describe('forget marker review: a stale copy across a forget, then the scope learned again', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });

  async function setup(ttlMs: number) {
    const prefix = unique('paver-test');
    const topic = unique('autoseq-rules');
    await createTopics([{ topic, partitions: 2, compacted: true }]);
    await sink.connect();
    const metrics = createAutoseqMetrics(new Registry(), () => 0);
    const epoch = { key: `${prefix}:aseq:epoch`, flag: restoreFlagKey(`${prefix}:aseq:epoch`), seen: 'e1' };
    await redis.set(epoch.key, epoch.seen);
    const copier: { snapshots?: ReturnType<typeof ruleCopier>['snapshots'] } = {};
    const sweeper = (over: { sink?: Sink; sweeps?: boolean } = {}) =>
      new ScopeRetirement({
        sweeps: over.sweeps ?? ttlMs > 0,
        redis,
        prefix,
        sink: over.sink ?? sink,
        topic,
        leaseMs: 10_000,
        graceMs: 120_000,
        log: silentLogger(),
        paused: () => false,
        epoch: { key: epoch.key, flag: epoch.flag, value: () => epoch.seen },
        onRetired: (outcome, n) => metrics.scopesRetired.inc({ outcome }, n),
        recopy: (written) => copier.snapshots!.mark(written),
      });
    const retirement = sweeper();
    const { snapshots } = ruleCopier(redis, prefix, sink, topic, retirement);
    copier.snapshots = snapshots;
    const learn = async (batch: ToolCallsEvent[]) => {
      const store = await learnBatch(redis, prefix, batch, LOW_BAR, ttlMs);
      snapshots.mark(store.written());
      await snapshots.flush();
      return store.written();
    };
    const redisCtxs = async (agent: string) =>
      (await redis.hkeys(learnKey(prefix, 'default', agent)))
        .filter((f) => f.startsWith('c:'))
        .map((f) => f.slice(2))
        .sort();
    const topicCtxs = async (agent: string) =>
      [
        ...((await readRulesLog(rulesReplay(topic), prefix)).scopes
          .find((s) => s.agent === agent)
          ?.ctxs.keys() ?? []),
      ].sort();
    /** `keep`: keys that outlive the loss (a shard kept, as a cluster's can). */
    const lose = async (keep: (key: string) => boolean = () => false) => {
      let cursor = '0';
      do {
        const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        cursor = next;
        const gone = keys.filter((k) => !keep(k));
        if (gone.length > 0) await redis.del(...gone);
      } while (cursor !== '0');
    };
    const newEpoch = async () => {
      epoch.seen = `${epoch.seen}+`;
      await redis.set(epoch.key, epoch.seen);
      await redis.set(epoch.flag, String(Date.now()));
    };
    const restore = () =>
      ttlMs > 0
        ? restoreRules(redis, prefix, epoch.flag, rulesReplay(topic), () => true, ttlMs, Date.now, {
            retirement,
            graceMs: 120_000,
          })
        : restoreRules(redis, prefix, epoch.flag, rulesReplay(topic));
    return {
      prefix,
      topic,
      sweeper,
      retirement,
      snapshots,
      learn,
      redisCtxs,
      topicCtxs,
      lose,
      newEpoch,
      restore,
    };
  }

  it("at TTL 0, the README's own case (the fence's send fails): once the scope is learned again and copied, a restore leaves out the forgotten contexts", async () => {
    const t = await setup(0);
    const before = await t.learn(asAgent('f'));
    const forgotten = await t.redisCtxs('f');
    const forgetter = t.sweeper({ sweeps: false });
    // Its copier retries the failed fence at its next copy, in memory; this one makes none (as one that stopped
    // first), so nothing retries it at TTL 0.
    const stalled = stalledAcrossForget(redis, sink, t.prefix, forgetter);
    const late = ruleCopier(
      redis,
      t.prefix,
      stalled.sink,
      t.topic,
      t.sweeper({ sink: stalled.sink, sweeps: false }),
    );
    late.snapshots.mark(before);
    await late.snapshots.flush();
    expect(stalled.sends()).toBe(2);
    // Another copier's next interval (the late one is not used again, as if it had stopped): the fence's recopy
    // marks name a scope without state, which a copy skips (and drops): nothing is left to tombstone the stale
    // records, as the README says for TTL 0 once the copier that failed its fence is gone.
    await t.snapshots.flush();

    // The agent is still running: the scope is learned again, from less than before, and copied.
    await t.learn(firstTask(asAgent('f', ':again')));
    const again = await t.redisCtxs('f');
    expect(again.length).toBeGreaterThan(0);
    // Precondition: some context the forget took is not learned again.
    const gone = forgotten.filter((c) => !again.includes(c));
    expect(gone.length).toBeGreaterThan(0);

    // Redis loses its state; the restore writes back what the topic holds.
    await t.lose();
    await t.newEpoch();
    await t.restore();
    // Only what was learned after the forget. On b914988 the stale copy's contexts come back with it.
    expect(await t.redisCtxs('f')).toEqual(again);
    // No sweep at TTL 0: the stale records stay on the topic, and every restore leaves them out.
    expect(await t.topicCtxs('f')).toEqual(expect.arrayContaining(gone));
  });

  it('at TTL > 0, no failure at all: the scope learned again before the stale copy is fenced, Redis lost before its recopy, the restore leaves out the forgotten contexts', async () => {
    const t = await setup(3_600_000);
    const before = await t.learn(asAgent('f'));
    const forgotten = await t.redisCtxs('f');
    let first = true;
    const stalled: Sink = {
      ...sink,
      sendRaw: async (topic, records) => {
        const stale = first;
        first = false;
        if (stale) {
          // The copy read the scope, then stalls past its lease; POST /rules/forget takes the lease meanwhile.
          await redis.del(leaseKey(t.prefix, 'default', 'f'));
          await t.retirement.forget('default', 'f');
        }
        await sink.sendRaw(topic, records);
        // Landed after the forget's tombstones. The agent is still running: a batch learns the scope again
        // (from less than before) and its copy lands, before the stale copy's lease check and fence.
        if (stale) await t.learn(firstTask(asAgent('f', ':again')));
      },
    };
    const late = ruleCopier(redis, t.prefix, stalled, t.topic, t.retirement).snapshots;
    late.mark(before);
    // The fence finds the scope with state (the copier's own): it leaves it to the stale round's recopy.
    await late.flush();
    const again = await t.redisCtxs('f');
    const gone = forgotten.filter((c) => !again.includes(c));
    expect(gone.length).toBeGreaterThan(0);
    // The forgotten contexts are on the topic, under a scope record that carries the forget's generation.
    expect(await t.topicCtxs('f')).toEqual(expect.arrayContaining(gone));

    // Redis is lost before the recopy runs (the recopy then finds no state and copies nothing).
    await t.lose();
    await late.flush();
    await t.newEpoch();
    const r = await t.restore();
    // Only what was learned after the forget. On b914988 the stale copy's contexts come back with it.
    expect(await t.redisCtxs('f')).toEqual(again);
    expect(r.stale).toBe(gone.length);
    // The restore queued the stale records for the sweep, which tombstones them and leaves the scope's own.
    await t.retirement.sweep();
    expect(await t.topicCtxs('f')).toEqual(again);
    expect(await t.redisCtxs('f')).toEqual(again);
    // Tombstoned, they stay out of a later restore whatever it finds.
    await t.lose();
    await t.newEpoch();
    await t.restore();
    expect(await t.redisCtxs('f')).toEqual(again);
  });

  it("a marker gone backwards (a stalled forget's lower marker landing last) is made up for by the generation Redis kept", async () => {
    const t = await setup(0);
    await t.learn(asAgent('f'));
    const forgetter = t.sweeper({ sweeps: false });
    await forgetter.forget('default', 'f');
    // Learned again after the first forget: copied at generation 1.
    const again = await t.learn(firstTask(asAgent('f', ':again')));
    expect(await t.redisCtxs('f')).not.toEqual([]);
    // A copy read at generation 1 stalls past its lease; a second forget (generation 2) runs meanwhile, and the
    // copy's fence fails: nothing tombstones the stale copy again.
    const stalled = stalledAcrossForget(redis, sink, t.prefix, forgetter);
    const late = ruleCopier(
      redis,
      t.prefix,
      stalled.sink,
      t.topic,
      t.sweeper({ sink: stalled.sink, sweeps: false }),
    );
    late.snapshots.mark(again);
    await late.snapshots.flush();
    expect(stalled.sends()).toBe(2);
    expect(await redis.get(forgetsKey(t.prefix, 'default', 'f'))).toBe('2');
    // The first forget's marker, its send stalled, lands last: compaction keeps generation 1, the stale copy's.
    await sink.sendRaw(t.topic, [
      { key: forgetMarkerKey(t.prefix, 'default', 'f'), value: forgetMarkerValue(1, Date.now()) },
    ]);

    // A loss that spares the scope's generation (a cluster shard kept); the restore reads it.
    await t.lose((k) => k.endsWith(':forgets'));
    await t.newEpoch();
    const r = await t.restore();
    expect(r.restored).toBe(0);
    // Before, the stale copy (generation 1) passed the marker of 1, its contexts with it.
    expect(await t.redisCtxs('f')).toEqual([]);
  });
});
