import { afterAll, describe, expect, it } from 'vitest';
import { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { closeFixture, engine, place, redis, redisSessions, sessionEvents } from './engine-fixture.js';

afterAll(closeFixture);

/** An event of session 's7' at `offset` of partition 0. */
const ev = sessionEvents('s7');

const firstTask = [
  ev(0, 'user_message', 's7:u1', { text: 'close my account' }),
  ev(1, 'tool_call', 's7:c0', { step: 0, tool: 'lookup_account' }),
  ev(2, 'tool_call', 's7:c1', { step: 1, tool: 'close_account' }),
  ev(3, 'task_completed', 's7:done1'),
];
/** The session's next task (a new request, new event ids), after the retried copy of the first request. */
const nextTask = (from: number) => [
  ev(from, 'user_message', 's7:u2', { text: 'change my seat' }),
  ev(from + 1, 'tool_call', 's7:c2', { step: 0, tool: 'change_seat' }),
  ev(from + 2, 'task_completed', 's7:done2'),
];

describe('a user_message retried after its session ended (real Redis and Kafka)', () => {
  const wired = async () => {
    const { prefix, flowsTopic, policy } = await place({
      minOccurrences: 100,
      shadowTrials: 0,
      shadowPrecision: 0,
    });
    const store = new RedisFlowStore(redis, prefix);
    const make = () =>
      engine(store, { ...policy, mode: 'manual' }, flowsTopic, Date.now, redisSessions(store)).e;
    return { store, make };
  };
  const runsOf = async (store: RedisFlowStore) =>
    (await store.loadRuns('acme', 'a1')).map((r) => ({ terms: r.terms, calls: r.calls }));
  const expected = [
    { terms: ['close', 'account'], calls: ['lookup_account', 'close_account'] },
    { terms: ['change', 'seat'], calls: ['change_seat'] },
  ];

  it('opens no session, in the process that ended it', async () => {
    const { store, make } = await wired();
    const e = make();
    await e.handle(firstTask);
    // A producer's retry of the first request, at a new offset, after the end.
    const out = await e.handle([ev(4, 'user_message', 's7:u1', { text: 'close my account' })]);
    expect(out.map((s) => s.event_id)).toEqual(['s7:u1']);
    await e.handle(nextTask(5));
    expect(await runsOf(store)).toEqual(expected);
  });

  it('opens no session in the next process either (the end is read back from Redis)', async () => {
    const { store, make } = await wired();
    await make().handle(firstTask);
    const next = make();
    await next.handle([ev(4, 'user_message', 's7:u1', { text: 'close my account' })]);
    await next.handle(nextTask(5));
    expect(await runsOf(store)).toEqual(expected);
  });

  it('a later task of the session keeps its earlier requests recognised', async () => {
    const { store, make } = await wired();
    await make().handle([...firstTask, ...nextTask(4)]);
    // Both tasks' requests again, read by the next process, then the session's third task.
    await make().handle([
      ev(7, 'user_message', 's7:u1', { text: 'close my account' }),
      ev(8, 'user_message', 's7:u2', { text: 'change my seat' }),
      ev(9, 'user_message', 's7:u3', { text: 'book a flight' }),
      ev(10, 'tool_call', 's7:c3', { step: 0, tool: 'book_flight' }),
      ev(11, 'task_completed', 's7:done3'),
    ]);
    expect(await runsOf(store)).toEqual([...expected, { terms: ['book', 'flight'], calls: ['book_flight'] }]);
  });
});
