import { describe, expect, it } from 'vitest';
import { createEpoch } from '../../../../shared/redis/epoch.js';
import { connections, scope, scopeStore } from './scope-fixture.js';
import { detectorGlobalKeys, detectorKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';

/*
 * The once-a-minute sweep acted on every registered scope whatever the Redis epoch. A rebuild replaying a
 * partition marks its scopes owed from its first change, so a replay longer than a publication's lock left them
 * "abandoned" to the sweep, which published a window part-way through its history: after an epoch that ended
 * without a loss (an evicted marker) it retracted a candidate the replay had not reached yet; after a loss,
 * with the publication maps not yet restored, it sent again a candidate retracted before the loss. Now the
 * service's sweep (`sweepRebuiltOnly`) leaves a scope until each of its partitions is rebuilt in the current
 * epoch, as batches wait for their partition's rebuild. A replay's length is made here by moving the owed mark
 * (`owedAt`, Redis's clock) a minute back, not by waiting.
 */

const { redis, sink } = connections();
/** A window of three tasks: a candidate leaves it once three tasks of other tools complete. */
const PARAMS = { ...DEFAULT_PARAMS, lookback: 3 };

/** Three tasks running `tools` on partition 0, their ids ending in `suffix`, their offsets from `first` on. */
function runs(tools: string[], suffix: string, first: number, t0: number): DetectorOp[] {
  const out: DetectorOp[] = [];
  let offset = first;
  for (const n of [1, 2, 3]) {
    const task = `t${n}${suffix}`;
    const ts = t0 + n * 1_000;
    tools.forEach((tool, step) =>
      out.push({
        kind: 'call',
        scope,
        task,
        eventId: `${task}-${step}`,
        ts: ts + step,
        step,
        tool,
        cost: 10_000,
        partition: 0,
        offset: String(offset++),
      }),
    );
    out.push({
      kind: 'done',
      scope,
      task,
      eventId: `${task}-done`,
      ts: ts + 10,
      partition: 0,
      offset: String(offset++),
    });
  }
  return out;
}
const first = runs(['lookup', 'check', 'close'], 'x', 0, 0);
const second = runs(['search', 'book', 'pay'], 'y', first.length, 10_000);

async function setup() {
  const base = await scopeStore({ redis, sink }, 'det-sweep-epoch');
  const store = new RedisDetectorStore(redis, PARAMS, base.prefix, 1_000);
  const sent: string[] = [];
  const publisher = base.publisher({
    store,
    params: PARAMS,
    sweepRebuiltOnly: true,
    onPublished: (status, n) => sent.push(...Array<string>(n).fill(status)),
  });
  const marker = detectorGlobalKeys(base.prefix).epoch;
  const epoch = createEpoch(redis, marker);
  const keys = detectorKeys(base.prefix, scope);
  /** The scope's oldest owed change a minute old: longer than a publication may take (1 s here). */
  const ageOwed = async () => {
    const [sec] = await redis.time();
    await redis.hset(keys.meta, 'owedAt', Number(sec) * 1000 - 60_000);
    expect(await store.abandoned()).toEqual([scope]);
  };
  /** Partition 0's batches applied and published under a fresh epoch: its state complete, as batches leave it. */
  const live = async (...batches: DetectorOp[][]) => {
    const { epoch: e } = await epoch.check();
    await store.markRebuilt(0, e);
    for (const ops of batches) {
      expect((await store.applyBatch(ops, { epoch: e })).lost).toBe(false);
      await publisher.publish(scope, true);
    }
    return e;
  };
  return { ...base, store, publisher, sent, marker, epoch, keys, ageOwed, live };
}

describe('detector: the sweep waits for the rebuild of a scope’s partitions', () => {
  it('an epoch ended without a loss: no retraction of a candidate the replay has not reached yet', async () => {
    const { store, publisher, sent, marker, epoch, keys, ageOwed, live } = await setup();
    await live(first);
    expect(sent).toEqual(['active']);
    const [published] = await redis.hkeys(keys.published);

    // The marker is evicted: the state stays, and partition 0 is rebuilt under a new epoch. Its replay has
    // cleared the scope (an earlier epoch's) and applied the first two tasks, and goes on for longer than a
    // publication may take.
    await redis.del(marker);
    const { epoch: e2 } = await epoch.check();
    expect((await store.applyBatch(first.slice(0, 8), { epoch: e2, mode: 'r' })).lost).toBe(false);
    await ageOwed();
    await publisher.sweep();
    expect(sent).toEqual(['active']);
    expect(await redis.hkeys(keys.published)).toEqual([published]);

    // The replay ends and the partition is marked: the sweep takes the scope up, and finds nothing to send.
    expect((await store.applyBatch(first.slice(8), { epoch: e2, mode: 'r' })).lost).toBe(false);
    await store.markRebuilt(0, e2);
    await ageOwed();
    await publisher.sweep();
    expect(await store.isOwed(scope)).toBe(false);
    expect(sent).toEqual(['active']);
    await publisher.close();
  });

  it('after a Redis loss: nothing sent from a lost batch’s state, nor from a replay before its partition is marked', async () => {
    const { prefix, store, publisher, sent, epoch, ageOwed, live } = await setup();
    // The first tools' candidate, then the second's, which pushes the first out of the window (retracted).
    const e1 = await live(first, second);
    expect([...sent].sort()).toEqual(['active', 'active', 'retracted']);

    // Redis comes back empty (only this test's keys: other files share this Redis).
    await redis.eval(
      "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
      0,
      `${prefix}:*`,
    );
    // A batch that verified the old epoch writes into the emptied Redis before it sees the loss (its instance
    // then dies before rebuilding): the first tools' candidate, retracted before the loss, is live in it.
    const before = [...sent];
    expect((await store.applyBatch(first, { epoch: e1 })).lost).toBe(true);
    await ageOwed();
    await publisher.sweep();
    expect(sent).toEqual(before);
    // Then partition 0's rebuild under a new epoch, part-way: the first tools' candidate, retracted before the
    // loss, is live in the window replayed so far, and the publication map is not restored yet.
    const { epoch: e2 } = await epoch.check();
    expect((await store.applyBatch(first, { epoch: e2, mode: 'r' })).lost).toBe(false);
    await ageOwed();
    await publisher.sweep();
    expect([...sent].sort()).toEqual(['active', 'active', 'retracted']);
    await publisher.close();
  });
});
