import { describe, expect, it } from 'vitest';
import { consumeUntil, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { connections, scope, scopeStore, threeRuns } from './scope-fixture.js';
import { detectorGlobalKeys, detectorKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';

/*
 * A change the detector applied is owed to the flow-candidates topic until a publication that saw it
 * releases. These tests leave a change unpublished the two ways an instance dying can (between its apply and
 * its publication; holding the publication lock) on a real Redis, and read the real topic for what follows.
 * Before the owed mark, the first case published nothing on redelivery (only duplicates: nothing "changed"),
 * and the second nothing at all: the dirty mark left for a dead holder is never read.
 */

const { redis, sink } = connections();
const ops = threeRuns;

async function setup() {
  const { prefix, topic, store, publisher: publisherWith } = await scopeStore({ redis, sink }, 'det-owed');
  const recovered: string[] = [];
  const publisher = publisherWith({ onRecovered: (via) => recovered.push(via) });
  return { prefix, topic, store, publisher, recovered };
}

describe('detector: a change is published even when the instance that applied it dies', () => {
  it('between its apply and its publication: the redelivered batch (only duplicates) publishes it', async () => {
    const { topic, store, publisher, recovered } = await setup();
    const first = await store.applyBatch(ops());
    expect(first.changed).toEqual([scope]);
    // The instance dies here. Its batch, uncommitted, goes to the partition's next owner. At first the change
    // is young (its instance may still be publishing it): nothing to do.
    const early = await store.applyBatch(ops());
    expect(early.applied).toBe(0);
    expect(early.changed).toEqual([]);
    // Once it is older than a publication may take, a batch of the scope (here, that redelivery) takes it up.
    const again = await waitFor(async () => {
      const r = await store.applyBatch(ops());
      return r.owed.length > 0 && r;
    }, 'the change to be owed for longer than a publication may take');
    expect(again.changed).toEqual([]);
    expect(again.owed).toEqual([scope]);
    await publisher.publish(scope, false);
    expect(recovered).toEqual(['batch']);
    const records = await consumeUntil(topic, (all) => all.length > 0);
    expect(records.map((r) => JSON.parse(String(r.value)) as { status: string })).toMatchObject([
      { status: 'active' },
    ]);
    // Published and released: nothing is owed any more.
    expect(await store.isOwed(scope)).toBe(false);
    expect((await store.applyBatch(ops())).owed).toEqual([]);
    await publisher.close();
  });

  it('holding the publication lock: the instance that found it held publishes once the lock runs out', async () => {
    const { prefix, topic, store, publisher, recovered } = await setup();
    expect((await store.applyBatch(ops())).changed).toEqual([scope]);
    // A holder that took the lock and died: nobody will read the dirty mark left for it.
    await redis.set(detectorKeys(prefix, scope).lock, 'dead-holder', 'PX', 5_000);
    await publisher.publish(scope, true);
    expect(publisher.waiting).toBe(1);
    const records = await consumeUntil(topic, (all) => all.length > 0);
    expect(records).toHaveLength(1);
    expect(recovered).toEqual(['retry']);
    // Released once the send was acknowledged, a moment after the record could be read.
    await waitFor(async () => !(await store.isOwed(scope)), 'the owed change to be released');
    await publisher.close();
  });

  it('a release clears only the changes its snapshot saw; a live holder leaves nothing to retry', async () => {
    const { store } = await setup();
    const [a, b] = [ops().slice(0, 8), ops().slice(8)];
    await store.applyBatch(a);
    const claimed = await store.claimSnapshot(scope, 'me', 30_000);
    if (claimed.held) throw new Error('lock held');
    // A change lands after this publication's snapshot: its release must leave it owed.
    expect((await store.applyBatch(b)).changed).toEqual([scope]);
    expect(await store.release(scope, 'me', 30_000, claimed.owed, [], [])).toEqual({ again: false, owed: 0 });
    expect(await store.isOwed(scope)).toBe(true);
    // Another instance finding the lock held marks the scope dirty: the holder publishes again and clears it.
    const second = await store.claimSnapshot(scope, 'me', 30_000);
    if (second.held) throw new Error('lock held');
    expect(await store.claimSnapshot(scope, 'other', 30_000)).toMatchObject({ held: true });
    const r = await store.release(scope, 'me', 30_000, second.owed, [], []);
    expect(r.again).toBe(true);
    expect(await store.release(scope, 'me', 30_000, r.owed, [], [])).toEqual({ again: false, owed: 0 });
    expect(await store.isOwed(scope)).toBe(false);
  });

  it('a change young enough to be in a live publication is left to it', async () => {
    const prefix = unique('det-owed');
    const store = new RedisDetectorStore(redis, DEFAULT_PARAMS, prefix, 60_000);
    expect((await store.applyBatch(ops())).changed).toEqual([scope]);
    // Another batch of the scope (here a redelivery) does not take it up, and a retry armed before it was
    // applied finds nothing owed since then.
    expect((await store.applyBatch(ops())).owed).toEqual([]);
    expect(await store.isOwed(scope)).toBe(true);
    expect(await store.isOwed(scope, 0)).toBe(false);
  });

  it('a change left owed in a scope that gets no more batches is published by the sweep', async () => {
    const { topic, store, publisher, recovered } = await setup();
    expect((await store.applyBatch(ops())).changed).toEqual([scope]);
    // Its instance dies before publishing, and the scope gets no more events: only the sweep can find it,
    // once it is older than a publication may take (1 s here).
    await waitFor(async () => (await store.abandoned()).length > 0, 'the change to count as abandoned');
    await publisher.sweep();
    expect(recovered).toEqual(['sweep']);
    expect(await consumeUntil(topic, (all) => all.length > 0)).toHaveLength(1);
    await waitFor(async () => (await store.abandoned()).length === 0, 'nothing left abandoned');
    await publisher.close();
  });
});

describe('detector: publication stamps (detected_at) follow publication order, whatever the hosts\u2019 clocks', () => {
  it('a publication is stamped after the scope\u2019s last one, even when that one was stamped ahead of this host', async () => {
    const { prefix, topic, store, publisher } = await setup();
    const all = ops();
    await store.applyBatch(all);
    await publisher.publish(scope, true);
    const first = await consumeUntil(topic, (r) => r.length >= 1);
    const stamp1 = (JSON.parse(String(first[0]!.value)) as { detected_at: number }).detected_at;
    // Redis's clock, not a host's: within a moment of this one.
    expect(Math.abs(stamp1 - Date.now())).toBeLessThan(60_000);
    // The scope's last publication was stamped an hour ahead (an instance whose clock ran ahead, in the
    // scheme before; or Redis's clock stepped back since): the next one must still come after it.
    const ahead = Date.now() + 3_600_000;
    await redis.set(detectorKeys(prefix, scope).stamp, ahead);
    // A fourth run of the same tools: the candidate's count changes, so it is published again.
    const more = ops().map((o) => ({
      ...o,
      task: `${o.task}x`,
      eventId: `${o.eventId}x`,
      offset: String(100 + Number(o.offset)),
    }));
    await store.applyBatch(more.slice(0, 4));
    await publisher.publish(scope, true);
    const records = await consumeUntil(topic, (r) => r.length >= 2);
    const stamp2 = (JSON.parse(String(records[1]!.value)) as { detected_at: number }).detected_at;
    expect(stamp2).toBeGreaterThan(ahead);
    await publisher.close();
  });
});

describe('detector: stamps restored after a loss', () => {
  it('a scope\u2019s latest stamp on the topic goes back under the next one (a new Redis\u2019s clock may be behind)', async () => {
    const { topic, store, publisher } = await setup();
    const ahead = Date.now() + 3_600_000;
    await store.restorePublished([], [{ scope, at: ahead }]);
    // Never lowered by a restore of an older stamp.
    await store.restorePublished([], [{ scope, at: ahead - 10_000 }]);
    await store.applyBatch(ops());
    await publisher.publish(scope, true);
    const records = await consumeUntil(topic, (r) => r.length >= 1);
    expect((JSON.parse(String(records[0]!.value)) as { detected_at: number }).detected_at).toBe(ahead + 1);
    await publisher.close();
  });
});

describe('detector: a publication on a scope without state leaves none', () => {
  it('after publishing a scope Redis holds no state for (restored candidates to retract), its next batch applies', async () => {
    const { prefix, store } = await setup();
    await redis.set(detectorGlobalKeys(prefix).epoch, 'epoch-1');
    const claimed = await store.claimSnapshot(scope, 'me', 30_000);
    if (claimed.held) throw new Error('lock held');
    await store.release(scope, 'me', 30_000, claimed.owed, [], []);
    // A stamp kept in `meta` made it a scope of another epoch: every batch of it then read as a Redis loss.
    const r = await store.applyBatch(ops(), { epoch: 'epoch-1' });
    expect(r.lost).toBe(false);
    expect(r.changed).toEqual([scope]);
  });
});
