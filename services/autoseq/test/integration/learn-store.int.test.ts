import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { toolCallsEventV1, type ToolCallsEvent } from '../../../../schemas/index.js';
import { rng } from '../../../../testkit/streams.js';
import { testRedis, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { readScope, RedisLearnStore } from '../../src/adapters/redis/learn-store.js';
import { leaseKey } from '../../src/adapters/redis/scope-lease.js';
import { applyEvent, MemoryLearnStore } from '../../src/core/learn/engine.js';
import { DEFAULT_LEARN, type LearnOptions } from '../../src/core/learn/learner.js';

const fixture = join(import.meta.dirname, '../fixtures/tau2-airline-30.jsonl');
const events = readFileSync(fixture, 'utf8')
  .trim()
  .split('\n')
  .map((l) => toolCallsEventV1.parse(JSON.parse(l)) as ToolCallsEvent);

describe('learned state in Redis, read in part (real Redis)', () => {
  const redis = testRedis();
  afterAll(() => redis.quit());

  // Small bounds: eviction runs many times, so some batches read the whole scope and most read a part.
  for (const [name, opts] of [
    ['default bounds', { ...DEFAULT_LEARN, minTrials: 5, minPrecision: 0.5 }],
    ['small bounds', { ...DEFAULT_LEARN, minTrials: 5, minPrecision: 0.5, maxContexts: 40, maxSlots: 20 }],
  ] as [string, LearnOptions][])
    it(`equals the in-memory state after every batch of random size (${name})`, async () => {
      const prefix = unique('paver-test');
      const memory = new MemoryLearnStore();
      const random = rng(7);
      let i = 0;
      let batches = 0;
      while (i < events.length) {
        const batch = events.slice(i, i + 1 + Math.floor(random() * 40));
        i += batch.length;
        const store = await RedisLearnStore.load(redis, prefix, 60_000, opts, batch, { ttlMs: 10_000 });
        for (const e of batch) {
          const a = applyEvent(store, e, opts);
          const b = applyEvent(memory, e, opts);
          expect(a?.next ?? null).toEqual(b?.next ?? null);
          expect(a?.held ?? null).toEqual(b?.held ?? null);
        }
        await store.save();
        batches++;
        const stored = await readScope(redis, prefix, 'default', 'default');
        expect(stored).toEqual(JSON.parse(JSON.stringify(memory.scope('default', 'default'))));
      }
      expect(batches).toBeGreaterThan(10);
      const m = memory.scope('default', 'default');
      expect(m.nActive).toBeGreaterThan(0);
      await redis.del(`${prefix}:aseq:{default|default}:rules`);
    });

  it('one batch at a time learns in a scope; a write after its lease expired is refused and writes nothing', async () => {
    const prefix = unique('paver-test');
    const opts = DEFAULT_LEARN;
    const [one, two] = [events.slice(0, 40), events.slice(40, 80)];
    const lease = leaseKey(prefix, 'default', 'default');
    const first = await RedisLearnStore.load(redis, prefix, 60_000, opts, one, { ttlMs: 60_000 });
    expect(await redis.get(lease)).toBe(first.leases.token);

    // A second batch of the scope waits for the first, then reads what the first wrote.
    let waits = 0;
    const pending = RedisLearnStore.load(redis, prefix, 60_000, opts, two, {
      ttlMs: 1_500,
      onWait: () => waits++,
    });
    await waitFor(async () => waits > 0, 'the second batch waiting');
    for (const e of one) applyEvent(first, e, opts);
    await first.save();
    const clock = first.scope('default', 'default').clock;
    expect(clock).toBeGreaterThan(0);
    const second = await pending;
    expect(second.scope('default', 'default').clock).toBe(clock);

    // Its lease lapses before it writes (a stall): the write is refused, retriably, and the state is as it was.
    for (const e of two) applyEvent(second, e, opts);
    await waitFor(async () => (await redis.exists(lease)) === 0, 'the second lease expired');
    await expect(second.save()).rejects.toMatchObject({ code: 'STATE_CONTENDED', retriable: true });
    expect((await readScope(redis, prefix, 'default', 'default'))!.clock).toBe(clock);

    // A batch that failed gives its lease back: the next one takes it without waiting.
    const failed = await RedisLearnStore.load(redis, prefix, 60_000, opts, two, { ttlMs: 60_000 });
    await failed.release();
    let waited = false;
    const retry = await RedisLearnStore.load(redis, prefix, 60_000, opts, two, {
      ttlMs: 60_000,
      onWait: () => (waited = true),
    });
    expect(waited).toBe(false);
    for (const e of two) applyEvent(retry, e, opts);
    await retry.save();
    expect((await readScope(redis, prefix, 'default', 'default'))!.clock).toBeGreaterThan(clock);
    expect(await redis.exists(lease)).toBe(0);
    await redis.del(`${prefix}:aseq:{default|default}:rules`);
  });
});
