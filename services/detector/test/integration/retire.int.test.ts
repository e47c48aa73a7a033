import { describe, expect, it } from 'vitest';
import { consumeUntil, waitFor } from '../../../../test/helpers/kafka.js';
import { connections, scope, scopeStore, threeRuns } from './scope-fixture.js';
import { detectorGlobalKeys, detectorKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';

/*
 * A scope (tenant, agent) no event reaches for DETECTOR_SCOPE_TTL_MS is retired by the sweep: its candidates
 * retracted on the topic, its state deleted from Redis, and it leaves the registries the checkpoints read.
 * Before, an idle scope's keys stayed for ever. Idleness is made here by moving the scope's last-apply time
 * (meta `seenAt`, Redis's clock) an hour back, not by waiting.
 */

const { redis, sink } = connections();
const ops = threeRuns;
const HOUR = 3_600_000;
type Rec = { status: string; dedupe_key: string };

async function setup() {
  const { prefix, topic, store, publisher: publisherWith } = await scopeStore({ redis, sink }, 'det-retire');
  const retired: string[] = [];
  const publisher = publisherWith({ scopeTtlMs: HOUR, onRetired: (o) => retired.push(o) });
  const keys = detectorKeys(prefix, scope);
  const registry = detectorGlobalKeys(prefix).scopes(0);
  /** The scope's last apply an hour and a minute ago. */
  const idle = async () => {
    const [sec] = await redis.time();
    await redis.hset(keys.meta, 'seenAt', Number(sec) * 1000 - HOUR - 60_000);
  };
  /** Every key of the scope (they share its hash tag). */
  const scopeKeys = async () => (await redis.keys(`${keys.meta.slice(0, -'meta'.length)}*`)).sort();
  const read = async (n: number) =>
    (await consumeUntil(topic, (all) => all.length >= n)).map((r) => JSON.parse(String(r.value)) as Rec);
  return { prefix, topic, store, publisher, publisherWith, retired, keys, registry, idle, scopeKeys, read };
}

describe('detector: idle scopes are retired', () => {
  it('retracts the candidates, deletes the state and unregisters the scope; new events start it afresh', async () => {
    const { prefix, store, publisher, retired, keys, registry, idle, scopeKeys, read } = await setup();
    // Another instance that has applied to the scope before: it remembers having registered it.
    const other = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000);
    await other.applyBatch(ops().slice(0, 4));
    await store.applyBatch(ops().slice(4));
    await publisher.publish(scope, true);
    const [active] = await read(1);
    expect(active).toMatchObject({ status: 'active' });
    expect(await redis.smembers(registry)).toHaveLength(1);

    // Not idle yet: the sweep leaves it.
    await publisher.sweep();
    expect(retired).toEqual([]);
    await idle();
    await publisher.sweep();
    expect(retired).toEqual(['retired']);
    const records = await read(2);
    expect(records[1]).toMatchObject({ status: 'retracted', dedupe_key: active!.dedupe_key });
    // Only the publication stamp is left, and it expires too.
    expect(await scopeKeys()).toEqual([keys.stamp]);
    expect(await redis.pttl(keys.stamp)).toBeGreaterThan(0);
    expect(await redis.smembers(registry)).toEqual([]);

    // The same scope again, through the instance that registered it before: registered again, counted afresh
    // (the retired state's completed task ids are forgotten too), and its candidate published again.
    const again = await other.applyBatch(ops('b', 100));
    expect(again.changed).toEqual([scope]);
    expect(await redis.smembers(registry)).toHaveLength(1);
    await publisher.publish(scope, true);
    expect((await read(3))[2]).toMatchObject({ status: 'active', dedupe_key: active!.dedupe_key });
    await publisher.close();
  });

  it('keeps a scope an event reaches between the two steps, and publishes all its live candidates again', async () => {
    const { store, publisher, retired, keys, registry, idle, read } = await setup();
    await store.applyBatch(ops());
    await publisher.publish(scope, true);
    await read(1);
    await idle();
    const claim = await store.retireClaim(scope, 'sweeper', HOUR);
    expect(claim).toMatchObject({ keys: [expect.any(String)] });
    // The sweeper retracts here (flows takes the retraction); then an event of a new task comes in.
    const late = ops('c', 200).slice(0, 1);
    expect((await store.applyBatch(late)).applied).toBe(1);
    expect(await store.retireFinish(scope, 'sweeper', HOUR, [0])).toBe('active');
    expect(await redis.hexists(keys.meta, 'cfg')).toBe(1);
    expect(await redis.smembers(registry)).toHaveLength(1);
    expect(await store.isOwed(scope)).toBe(true);
    // The candidate has not changed, yet it is published again: flows may hold it as retracted.
    await publisher.publish(scope, true);
    expect((await read(2))[1]).toMatchObject({ status: 'active' });
    // And only once: the mark is gone with that publication.
    await store.applyBatch(ops('c', 200).slice(1, 2));
    await publisher.publish(scope, true);
    await publisher.sweep();
    expect(retired).toEqual([]);
    expect((await read(2)).length).toBe(2);
    await publisher.close();
  });

  it('a publication that dies before sending what the retirement mark asked for leaves the mark to the next one', async () => {
    const { store, publisher, publisherWith, keys, idle, read } = await setup();
    await store.applyBatch(ops());
    await publisher.publish(scope, true);
    await read(1);
    await idle();
    // The sweeper retracts, then an event keeps the scope: it is owed, and marked to send everything again.
    expect(await store.retireClaim(scope, 'sweeper', HOUR)).not.toBeNull();
    await store.applyBatch(ops('c', 200).slice(0, 1));
    expect(await store.retireFinish(scope, 'sweeper', HOUR, [0])).toBe('active');
    // A publication claims the scope and dies before sending anything (Kafka down, SIGKILL): its lock runs out.
    const dying = await store.claimSnapshot(scope, 'dying', 1_000);
    expect(dying.held).toBe(false);
    await redis.del(keys.lock);
    // The next publication must still send the candidate again: flows holds it as retracted.
    const sent: string[] = [];
    const next = publisherWith({ onPublished: (status, n) => sent.push(...Array<string>(n).fill(status)) });
    await next.publish(scope, true);
    expect(sent).toEqual(['active']);
    expect((await read(2))[1]).toMatchObject({ status: 'active' });
    await next.close();
    await publisher.close();
  });

  it('a sweeper that dies between the two steps: the next sweep retires the scope once the lock runs out', async () => {
    const { store, publisher, retired, keys, idle, scopeKeys, read } = await setup();
    await store.applyBatch(ops());
    await publisher.publish(scope, true);
    await read(1);
    await idle();
    expect(await store.retireClaim(scope, 'dead-sweeper', HOUR)).not.toBeNull();
    // The dead sweeper's lock holds the scope until it runs out (1 s here).
    await publisher.sweep();
    expect(retired).toEqual([]);
    await waitFor(
      async () => {
        await publisher.sweep();
        return retired.length > 0;
      },
      'the scope to be retired once the dead sweeper’s lock ran out',
      30_000,
    );
    expect(retired).toEqual(['retired']);
    expect(await scopeKeys()).toEqual([keys.stamp]);
    expect((await read(2))[1]).toMatchObject({ status: 'retracted' });
    await publisher.close();
  });

  it('an instance that registered the scope on two partitions registers it again on each it brings state back to', async () => {
    const { prefix, publisher, retired, idle } = await setup();
    const registries = detectorGlobalKeys(prefix);
    /** One tool call of a task of its own, on `partition`. */
    const call = (task: string, partition: number, offset: number): DetectorOp => ({
      kind: 'call',
      scope,
      task,
      eventId: `${task}-0`,
      ts: 1_000 + offset,
      step: 0,
      tool: 'lookup',
      cost: 1,
      partition,
      offset: String(offset),
    });
    // An instance that owns both partitions, and has registered the scope on both.
    const other = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000);
    await other.applyBatch([call('p0', 0, 1), call('p1', 1, 1)]);
    await idle();
    await publisher.sweep();
    expect(retired).toEqual(['retired']);
    expect(await redis.smembers(registries.scopes(1))).toEqual([]);
    // Back on partition 0 first: the scope's state is new there, so it is registered again there.
    await other.applyBatch([call('q0', 0, 2)]);
    // Then on partition 1, in a later batch: the scope has state (from partition 0), but none on partition 1
    // until now. The checkpoint of partition 1 reads its registry: without the scope it would pass the task's
    // first offset, and a rebuild after a Redis loss would never replay it.
    await other.applyBatch([call('q1', 1, 2)]);
    expect(await redis.smembers(registries.scopes(0))).toHaveLength(1);
    expect(await redis.smembers(registries.scopes(1))).toHaveLength(1);
    await publisher.close();
  });

  it('a scope whose registration after its apply failed is registered by the batch’s retry', async () => {
    const { prefix, publisher, retired, registry, idle } = await setup();
    // An instance that has registered the scope before it was retired.
    const other = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000);
    await other.applyBatch(ops());
    await idle();
    await publisher.sweep();
    expect(retired).toEqual(['retired']);
    // The registration that follows the apply fails (a registry Redis refuses to write, here by its type).
    await redis.set(registry, 'not a set');
    const batch = ops('d', 100);
    await expect(other.applyBatch(batch)).rejects.toThrow();
    await redis.del(registry);
    // The batch is applied again (its events are now duplicates): the scope holds state, so it must be registered.
    await other.applyBatch(batch);
    expect(await redis.smembers(registry)).toHaveLength(1);
    await publisher.close();
  });

  it('a scope left out of its registry while it has state (a sweeper died between its round trips) is registered again by its next batch', async () => {
    const { prefix, registry } = await setup();
    // Trusting its memory of the registration for no time at all here (a minute in the service).
    const instance = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000, 0);
    const trusting = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000);
    await instance.applyBatch(ops().slice(0, 4));
    await trusting.applyBatch(ops().slice(4, 8));
    // The dead sweeper took the scope out and never put it back.
    await redis.srem(registry, JSON.stringify([scope.tenant, scope.agent]));
    // Within the minute an instance does not register it again; after it, the scope's next batch does.
    await trusting.applyBatch(ops().slice(8, 9));
    expect(await redis.smembers(registry)).toEqual([]);
    await instance.applyBatch(ops().slice(9, 10));
    expect(await redis.smembers(registry)).toHaveLength(1);
  });

  it('a claim whose lock ran out before the finish: reported lost, nothing deleted', async () => {
    const { store, publisher, keys, registry, idle } = await setup();
    await store.applyBatch(ops());
    await idle();
    expect(await store.retireClaim(scope, 'slow-sweeper', HOUR)).not.toBeNull();
    // The lock's TTL ran out while the retractions were sent.
    await redis.del(keys.lock);
    expect(await store.retireFinish(scope, 'slow-sweeper', HOUR, [0])).toBe('lost');
    expect(await redis.hexists(keys.meta, 'cfg')).toBe(1);
    expect(await redis.smembers(registry)).toHaveLength(1);
    await publisher.close();
  });

  it('after a Redis loss, a retired scope’s stamp comes back from the topic expiring, as retirement left it', async () => {
    const { store, publisher, keys } = await setup();
    const [sec] = await redis.time();
    const at = Number(sec) * 1000;
    // restorePublished reads every scope's latest stamp on the topic, retired scopes' retractions included.
    await store.restorePublished([], [{ scope, at }], HOUR);
    expect(await redis.get(keys.stamp)).toBe(String(at));
    const ttl = await redis.pttl(keys.stamp);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(HOUR);
    // A stamp a publication made permanent stays so when raised.
    await redis.persist(keys.stamp);
    await store.restorePublished([], [{ scope, at: at + 10 }], HOUR);
    expect(await redis.get(keys.stamp)).toBe(String(at + 10));
    expect(await redis.pttl(keys.stamp)).toBe(-1);
    await publisher.close();
  });

  it('a registration whose scope has no state (its apply never wrote any) is taken out by the sweep', async () => {
    const { prefix, publisher, retired, registry, keys } = await setup();
    const other = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000);
    // Registered in the pipeline before its script, which then refuses (the meta key is of another type).
    await redis.set(keys.meta, 'not a hash');
    await expect(other.applyBatch(ops())).rejects.toThrow();
    await redis.del(keys.meta);
    expect(await redis.smembers(registry)).toHaveLength(1);
    await publisher.sweep();
    expect(await redis.smembers(registry)).toEqual([]);
    expect(retired).toEqual([]);
    await publisher.close();
  });

  it('state written before scopes recorded their last apply gets its idle time from the first sweep', async () => {
    const { store, publisher, retired, keys } = await setup();
    await store.applyBatch(ops());
    await redis.hdel(keys.meta, 'seenAt');
    await publisher.sweep();
    expect(retired).toEqual([]);
    expect(await redis.hexists(keys.meta, 'seenAt')).toBe(1);
    await publisher.close();
  });

  it('an instance remembers its registrations for the refresh period only, not every scope it ever applied to', async () => {
    const { prefix } = await setup();
    // Trusting its memory for no time at all (a minute in the service): each batch finds the earlier ones' stale.
    const instance = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 1_000, 0);
    // One scope per run (a run id in agent_id), each seen once.
    const runs: DetectorOp[] = Array.from({ length: 50 }, (_, i) => ({
      kind: 'done',
      scope: { tenant: 'acme', agent: `run-${i}` },
      task: `t${i}`,
      eventId: `e${i}`,
      ts: 1_000 + i,
      partition: 0,
      offset: String(i),
    }));
    await instance.applyBatch(runs);
    expect(instance.rememberedRegistrations).toBe(50);
    await instance.applyBatch(ops().slice(0, 1));
    expect(instance.rememberedRegistrations).toBe(1);
    expect(await redis.smembers(detectorGlobalKeys(prefix).scopes(0))).toHaveLength(51);
  });
});
