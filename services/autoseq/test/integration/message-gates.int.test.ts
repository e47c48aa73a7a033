import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import {
  catalogPolicyV1,
  catalogToolV1,
  type NextActionRecord,
  type ToolCallEvent,
  type ToolCallsEvent,
} from '../../../../schemas/index.js';
import type { InboundRecord } from '../../../../shared/kafka/chunk.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createBatchHandler } from '../../src/adapters/batch.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { RedisLearnStore } from '../../src/adapters/redis/learn-store.js';
import { RedisTaskStore, taskKey } from '../../src/adapters/redis/task-store.js';
import { Catalog } from '../../src/core/catalog.js';
import { DEFAULT_OPTIONS } from '../../src/core/decide.js';
import { DEFAULT_LEARN, type LearnOptions } from '../../src/core/learn/learner.js';
import { SchemaCompiler } from '../../src/core/schema-compiler.js';

/** A low bar, so that a few tasks prove the rules. */
const lopts: LearnOptions = { ...DEFAULT_LEARN, minTrials: 5, minPrecision: 0.5, targetPrecision: 0.5 };

function catalog(): Catalog {
  const c = new Catalog(new SchemaCompiler());
  const spec = (name: string, more: Record<string, unknown> = {}) =>
    catalogToolV1.parse({
      name,
      args_schema: { type: 'object', properties: { page: { type: 'integer' } }, required: ['page'] },
      side_effects: 'read',
      auto_seq: true,
      auto_seq_execute: true,
      ...more,
    });
  c.loadAgent({
    tenant_id: 'default',
    agent_id: 'default',
    tools: [spec('list_all'), spec('lookup', { auto_seq: false }), spec('search', { auto_seq: false })],
    policy: catalogPolicyV1.parse({ auto_seq_enabled: true, auto_seq_execute: true }),
  });
  return c;
}

/**
 * The service's batch handler over a real Redis (typed and learned task states stored between batches), its
 * records kept by a stand-in sink.
 */
describe("a record published after a later user message is gated by the task's last call (real Redis, the service batch handler)", () => {
  const redis = testRedis();
  afterAll(async () => {
    await redis.quit();
  });
  const ctx = { heartbeat: async () => undefined, isRunning: () => true };

  it('after a call that failed, a parallel action, actions queued or a call that saw no tool, the proposal made again is not executable', async () => {
    const prefix = unique('paver-test');
    const out: NextActionRecord[] = [];
    const sink: Sink = {
      connect: async () => undefined,
      send: async (_topic, _contract, records) => {
        for (const r of records) out.push(r.value as NextActionRecord);
      },
      sendRaw: async () => undefined,
      disconnect: async () => undefined,
      isConnected: () => true,
    };
    const handle = createBatchHandler({
      catalog: catalog(),
      store: new RedisTaskStore(redis, prefix, 60_000),
      loadLearn: (events, c, positions) =>
        RedisLearnStore.load(
          redis,
          prefix,
          60_000,
          lopts,
          events,
          { ttlMs: 10_000, heartbeat: c.heartbeat, isRunning: c.isRunning },
          positions,
        ),
      taskKey: (ref) => taskKey(prefix, ref),
      opts: DEFAULT_OPTIONS,
      lopts,
      sink,
      topic: 'next-actions',
      metrics: createAutoseqMetrics(new Registry(), () => 1),
    });
    let offset = 0;
    let ts = 1;
    const send = (events: ToolCallsEvent[]) =>
      handle(
        events.map((value) => ({
          topic: 'tool-calls',
          partition: 0,
          offset: String(offset++),
          key: value.session_id,
          timestamp: '0',
          value,
        })) as InboundRecord<ToolCallsEvent>[],
        ctx,
      );
    const base = (task: string) => ({
      ts: ts++,
      tenant_id: 'default',
      agent_id: 'default',
      session_id: task,
      task_id: task,
    });
    const message = (task: string, n: number): ToolCallsEvent => ({
      ...base(task),
      type: 'user_message',
      event_id: `${task}:u${n}`,
      text: n === 0 ? 'Please help me with my booking.' : 'Yes, go on.',
    });
    const call = (task: string, step: number, more: Partial<ToolCallEvent>): ToolCallEvent => ({
      ...base(task),
      type: 'tool_call',
      event_id: `${task}:${step}`,
      step,
      tool: 'search',
      ...more,
    });
    const listAll = { tool: 'list_all', args: { page: 1 }, observation: { items: ['a'] } };
    const failed = {
      tool: 'lookup',
      args: { q: 'x' },
      status: 'error',
      observation: 'Error: not found',
    } as const;
    const found = { tool: 'search', args: { q: 'x' }, observation: { result: 'fine' } };

    // After a failed lookup, or a good search, the agent lists everything: both rules are proven.
    const training: ToolCallsEvent[] = [];
    for (let i = 0; i < 12; i++)
      for (const first of [failed, found]) {
        const task = `train-${first.tool}-${i}`;
        training.push(message(task, 0), call(task, 0, first), call(task, 1, listAll), {
          ...base(task),
          type: 'task_completed',
          event_id: `${task}:end`,
        });
      }
    await send(training);

    /** The record of the call, and the record of a later user message in its own batch. */
    const decided = async (task: string, last: Partial<ToolCallEvent>) => {
      await send([message(task, 0), call(task, 0, last)]);
      await send([message(task, 1)]);
      const of = (id: string) => out.filter((r) => r.event_id === id).at(-1);
      return { call: of(`${task}:0`), message: of(`${task}:u1`) };
    };
    // A plain good call: executable after the call and after the message (the same decision again).
    const plain = await decided('plain', found);
    for (const r of [plain.call, plain.message])
      expect(r).toMatchObject({ tool: 'list_all', origin: 'learned', rule_state: 'active', execute: true });

    const cases: [string, Partial<ToolCallEvent>][] = [
      ['status-error', failed],
      // No status: the output says it failed, as the learner judges it (failedOutput).
      ['failed-output', { ...failed, status: undefined }],
      ['parallel', { ...found, next_node: 'parallel' }],
      ['pending', { ...found, pending_actions: 1 }],
      ['nothing-visible', { ...found, visible_tools: [] }],
    ];
    for (const [task, last] of cases) {
      const d = await decided(task, last);
      expect.soft(d.call, task).toMatchObject({ tool: 'list_all', rule_state: 'active', execute: false });
      // Before: execute true, the gates read the user message (no status, no next_node, no visible_tools); and
      // after an output judged failed without a status, the call's own record was executable too.
      expect.soft(d.message, task).toMatchObject({ tool: 'list_all', rule_state: 'active', execute: false });
    }
  });
});
