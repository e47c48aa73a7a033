import { afterAll, describe, expect, it } from 'vitest';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { detectorGlobalKeys, RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { DetectorOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS, type DetectorParams } from '../../src/core/params.js';
import { DetectorState } from '../../src/core/state.js';

const redis = testRedis();
afterAll(() => redis.disconnect());

/**
 * Config the service accepts (DETECTOR_MAX_LENGTH ≤ 100, DETECTOR_MAX_TASK_EVENTS ≤ 100000): a long task with
 * varied tools completes in a small (live-sized) batch. apply-11.lua's non-bulk support read does
 * HMGET(key, unpack(grams of that bucket)) with no bound: past Lua's ~8000 stack slots the script fails
 * (REDIS_SCRIPT_FAILED, non-retriable -> the consumer stops, and the redelivered batch fails the same way).
 */
describe('a long task completed in a small batch (real Redis)', () => {
  it('is applied as core/state.ts applies it: its grams read in bounded HMGETs (one HMGET of them all failed the script, fatally)', async () => {
    const params: DetectorParams = { ...DEFAULT_PARAMS, maxLength: 100, maxTaskEvents: 2_000 };
    const prefix = unique('longtask');
    const store = new RedisDetectorStore(redis, params, prefix);
    const epoch = 'e1';
    await redis.set(detectorGlobalKeys(prefix).epoch, epoch);
    const scope = { tenant: 't', agent: 'a' };
    let seed = 7;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const calls: DetectorOp[] = [];
    for (let i = 0; i < 2_000; i++)
      calls.push({
        kind: 'call',
        scope,
        task: 'task-1',
        eventId: `e${i}`,
        ts: 1_000 + i,
        step: i,
        tool: `tool_${Math.floor(rnd() * 40)}`,
        cost: 10_000,
        partition: 0,
        offset: String(i),
      });
    const done: DetectorOp = {
      kind: 'done',
      scope,
      task: 'task-1',
      eventId: 'd',
      ts: 5_000,
      partition: 0,
      offset: '2000',
    };
    const mem = new DetectorState(params);
    for (let i = 0; i < calls.length; i += 500) {
      mem.applyAll(calls.slice(i, i + 500));
      await store.applyBatch(calls.slice(i, i + 500), { epoch });
    }
    const m = mem.applyAll([done]);
    const out = await store.applyBatch([done], { epoch });
    expect(out.completed).toBe(m.completed);
    expect(out.completed).toBe(1);
  }, 120_000);
});
