import { afterAll, describe, expect, it } from 'vitest';
import { toolCallsEventV1, type ToolCallsEvent } from '../../schemas/index.js';
import { createEpoch } from '../../shared/redis/epoch.js';
import { RedisLearnStore } from '../../services/autoseq/src/adapters/redis/learn-store.js';
import { DEFAULT_LEARN } from '../../services/autoseq/src/core/learn/learner.js';
import { RedisSessionStore, sessionKey } from '../../services/sequencer/src/adapters/redis/store.js';
import { newSession } from '../../services/sequencer/src/core/session.js';
import { testRedis, unique } from '../helpers/kafka.js';

/*
 * A Redis loss between a batch's epoch check and its reads: the batch would read nothing, write fresh state, and
 * the restore would then leave that scope alone (autoseq) or overwrite the batch's effects (sequencer). Both
 * stores read the marker after their reads, and a marker gone or replaced fails the batch, retriably, before
 * it writes anything.
 */
const redis = testRedis();
afterAll(() => redis.quit());

describe("a Redis loss between the epoch check and a batch's reads (real Redis)", () => {
  it('the sequencer store refuses to load, retriably, and loads once the marker is the one seen', async () => {
    const prefix = unique('paver-test');
    const epoch = createEpoch(redis, `${prefix}:seq:epoch`);
    await epoch.check();
    const store = new RedisSessionStore(redis, prefix, 60_000, undefined, () => ({
      key: epoch.key,
      value: epoch.current(),
    }));
    const ref = { tenant: 't', agent: 'a', session: 's' };
    await store.save([{ ref, state: { ...newSession(), index: 3 }, version: '' }]);
    expect((await store.load(new Map([['s', ref]]))).get('s')!.state.index).toBe(3);

    // The loss: state and marker gone (as a FLUSHALL takes both) after the guard's check passed.
    await redis.del(epoch.key, sessionKey(prefix, ref));
    await expect(store.load(new Map([['s', ref]]))).rejects.toMatchObject({ code: 'STATE_CONTENDED' });
    // An allowed-tools read too: it says the state it read may be lost, rather than answer as a new session.
    expect(await store.fromRedis(ref)).toBeNull();
    // The guard's next check sees the loss (and a restore would run): then reads go on.
    expect((await epoch.check()).lost).toBe(true);
    expect((await store.load(new Map([['s', ref]]))).get('s')!.state.index).toBe(0);
    expect((await store.fromRedis(ref))!.index).toBe(0);
  });

  it('the autoseq learned store refuses to load (leases given back), retriably', async () => {
    const prefix = unique('paver-test');
    const epoch = createEpoch(redis, `${prefix}:aseq:epoch`);
    await epoch.check();
    const e = toolCallsEventV1.parse({
      type: 'tool_call',
      event_id: 'e1',
      session_id: 's1',
      task_id: 't1',
      ts: 1,
      step: 0,
      tool: 'lookup',
      args: {},
    }) as ToolCallsEvent;
    const marker = () => ({ key: epoch.key, value: epoch.current() });
    // The marker as the guard saw it at each batch's start.
    const load = () =>
      RedisLearnStore.load(redis, prefix, 60_000, DEFAULT_LEARN, [e], { ttlMs: 10_000 }, undefined, marker());
    await (await load()).release();

    await redis.del(epoch.key);
    await expect(load()).rejects.toMatchObject({ code: 'STATE_CONTENDED' });
    // Its leases went back with the failure: the retry takes them at once.
    expect(await redis.exists(`${prefix}:aseq:{default|default}:lease`)).toBe(0);
    expect((await epoch.check()).lost).toBe(true);
    await (await load()).release();
  });
});
