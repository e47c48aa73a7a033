import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import type { Inbound } from '../../src/adapters/engine.js';
import { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { closeFixture, engine, place, redis, redisSessions } from './engine-fixture.js';

afterAll(closeFixture);

let ts = 1;
/** Events of session 's1' of agent `agent`, at offsets of one partition (the topic is keyed by session id). */
const ev = (
  agent: string,
  offset: number,
  type: ToolCallsEvent['type'],
  extra: Record<string, unknown> = {},
): Inbound => ({
  kind: 'event',
  e: {
    tenant_id: 'acme',
    agent_id: agent,
    session_id: 's1',
    task_id: 's1',
    type,
    event_id: `${agent}:${offset}`,
    ts: ts++,
    ...extra,
  } as ToolCallsEvent,
  partition: 0,
  offset: String(offset),
});

describe('open sessions per scope (real Redis)', () => {
  it("two agents' sessions with the same id record each agent's own run, across a restart", async () => {
    const { prefix, flowsTopic, policy } = await place({
      minOccurrences: 100,
      shadowTrials: 0,
      shadowPrecision: 0,
    });
    const store = new RedisFlowStore(redis, prefix);
    const wired = () =>
      engine(store, { ...policy, mode: 'manual' }, flowsTopic, Date.now, redisSessions(store)).e;
    await wired().handle([
      ev('agent-a', 0, 'user_message', { text: 'close my account' }),
      ev('agent-b', 1, 'user_message', { text: 'book a flight' }),
      ev('agent-a', 2, 'tool_call', { step: 0, tool: 'lookup_account' }),
      ev('agent-b', 3, 'tool_call', { step: 0, tool: 'search_flights' }),
    ]);
    // Another process takes the partition over: both sessions are read back from Redis.
    const next = wired();
    await next.handle([
      ev('agent-a', 4, 'tool_call', { step: 1, tool: 'close_account' }),
      ev('agent-b', 5, 'tool_call', { step: 1, tool: 'book_flight' }),
      ev('agent-a', 6, 'task_completed'),
      ev('agent-b', 7, 'task_completed'),
    ]);
    const runs = async (agent: string) => (await store.loadRuns('acme', agent)).map((r) => r.calls);
    expect({ a: await runs('agent-a'), b: await runs('agent-b') }).toEqual({
      a: [['lookup_account', 'close_account']],
      b: [['search_flights', 'book_flight']],
    });
  });
});
