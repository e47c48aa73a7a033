import { afterAll, describe, expect, it } from 'vitest';
import { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { closeFixture, engine, place, redis, redisSessions, sessionEvents } from './engine-fixture.js';

afterAll(closeFixture);

/** An event of session 's9' at `offset` of partition 0. */
const ev = sessionEvents('s9');

describe('event_id as the idempotency key (real Redis)', () => {
  it('a tool_call produced twice counts once, also when its copy comes to the next process', async () => {
    const { prefix, flowsTopic, policy } = await place({
      minOccurrences: 100,
      shadowTrials: 0,
      shadowPrecision: 0,
    });
    const store = new RedisFlowStore(redis, prefix);
    const wired = () =>
      engine(store, { ...policy, mode: 'manual' }, flowsTopic, Date.now, redisSessions(store)).e;
    const lookup = { step: 0, tool: 'lookup_account' };
    await wired().handle([
      ev(0, 'user_message', 's9:u', { text: 'close my account' }),
      ev(1, 'tool_call', 's9:c0', lookup),
      // A producer's retry: the same event at the next offset.
      ev(2, 'tool_call', 's9:c0', lookup),
    ]);
    // The next process reads the session back from Redis, and gets another copy.
    await wired().handle([
      ev(3, 'tool_call', 's9:c0', lookup),
      ev(4, 'tool_call', 's9:c1', { step: 1, tool: 'close_account' }),
      ev(5, 'task_completed', 's9:done'),
    ]);
    expect((await store.loadRuns('acme', 'a1')).map((r) => r.calls)).toEqual([
      ['lookup_account', 'close_account'],
    ]);
  });
});
