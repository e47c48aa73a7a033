import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { toolCallsEventV1, type ToolCallsEvent } from '../../../../schemas/index.js';
import { rng } from '../../../../testkit/streams.js';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { readScope, RedisLearnStore } from '../../src/adapters/redis/learn-store.js';
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
        const store = await RedisLearnStore.load(redis, prefix, 60_000, opts, batch);
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
});
