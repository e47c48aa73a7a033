/**
 * One scope's flows engine over a real Redis and Kafka, for tests that put writers, failures and restarts
 * around its writes (a keyspace and topics of their own per test).
 */
import type { FlowCandidateRecord, ToolCallsEvent } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import {
  FlowsEngine,
  type CandidateStore,
  type EngineDeps,
  type Inbound,
} from '../../src/adapters/engine.js';
import { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { CandidateStates, stateWriter } from '../../src/adapters/state-feed.js';
import { OutcomeBook } from '../../src/core/outcomes.js';
import type { PromotionPolicy } from '../../src/core/promotion.js';
import { PromptCache } from '../../src/core/prompt.js';
import { FlowRegistry } from '../../src/core/registry.js';
import { DEFAULT_POLICY } from '../../src/core/select.js';

export const redis = testRedis();
export const sink = createSink(testKafka(), jsonCodec());
export const T = 'acme';
export const A = 'support';

/** For the test file's afterAll. */
export async function closeFixture(): Promise<void> {
  await sink.disconnect();
  await redis.quit();
}

export const TOOLS = ['lookup_account', 'close_account'];
export const record = (key: string, occurrences: number, detectedAt: number): FlowCandidateRecord => ({
  schema_version: 1,
  status: 'active',
  tenant_id: T,
  agent_id: A,
  dedupe_key: key,
  detected_at: detectedAt,
  title: 'close account',
  source_kind: 'tool_sequence',
  occurrence_count: occurrences,
  estimated_token_savings: 10,
  candidate: {
    tool_sequence: TOOLS,
    occurrence_count: occurrences,
    match_type: 'exact',
    estimated_token_savings: 10,
    avg_cost_per_execution: 1,
    dedupe_key: key,
    proposed_flow: {
      name: 'close_account',
      description: 'close the account of the user',
      tags: [],
      steps: TOOLS.map((t, i) => ({
        id: `s${i}`,
        name: t,
        skill_key: t,
        depends_on: [],
        output_key: `o${i}`,
        retry_max: 0,
        retry_backoff: 0,
        timeout_seconds: 30,
        on_failure: 'stop' as const,
        input_map: {},
      })),
    },
  },
  promotion_effect: null,
});

export function engine(
  store: CandidateStore,
  policy: PromotionPolicy,
  flowsTopic: string,
  now = Date.now,
  more: Partial<EngineDeps> = {},
) {
  const seen = { contention: 0 };
  const e = new FlowsEngine({
    store,
    publishFlows: (flows) =>
      sink.send(
        flowsTopic,
        'flows.v1',
        flows.map((flow) => ({ key: flow.id, value: { schema_version: 1, flow } })),
      ),
    withdrawFlows: (ids) =>
      sink.sendRaw(
        flowsTopic,
        ids.map((id) => ({ key: id, value: null })),
      ),
    onContention: () => seen.contention++,
    selector: {
      registry: new FlowRegistry(),
      prompts: new PromptCache(),
      budgetMs: 100,
      outcomes: new OutcomeBook({ capacity: 0, neighbours: 10, wrongCost: 4 }),
    },
    promotionPolicy: () => policy,
    selectPolicy: () => DEFAULT_POLICY,
    now,
    ...more,
  });
  return { e, seen };
}

/** The service's wiring of open sessions and runs to Redis (src/main.ts), for an engine that outlives a restart. */
export const redisSessions = (store: RedisFlowStore): Partial<EngineDeps> => ({
  sessions: {
    load: (refs) => store.loadSessions(refs),
    save: (open, ended) => store.saveSessions(open, ended, 60_000),
  },
  runs: {
    load: (t, a) => store.loadRuns(t, a),
    append: (t, a, run, mark) => store.appendRun(t, a, run, 50, mark),
  },
});

let ts = 1;
/** A whole session (request, calls, end); at `partition`, from `offset` on, when given (as the service reads it). */
export const session = (id: string, at?: { partition: number; offset: number }): Inbound[] =>
  (
    [
      { type: 'user_message', event_id: `${id}:u`, text: 'please close my account' },
      ...TOOLS.map((tool, step) => ({
        type: 'tool_call',
        event_id: `${id}:${step}`,
        task_id: id,
        step,
        tool,
        args: {},
        observation: 'ok',
      })),
      { type: 'task_completed', event_id: `${id}:done`, task_id: id },
    ] as const
  ).map((x, i) => ({
    kind: 'event' as const,
    e: { ...x, tenant_id: T, agent_id: A, session_id: id, ts: ts++ } as ToolCallsEvent,
    ...(at ? { partition: at.partition, offset: String(at.offset + i) } : {}),
  }));

/**
 * Events of session `id` (its one task, same id) of tenant 'acme', agent 'a1', at `offset` of partition 0, each
 * with the next `ts` (from 1, per builder).
 */
export function sessionEvents(id: string) {
  let ts = 1;
  return (
    offset: number,
    type: ToolCallsEvent['type'],
    eventId: string,
    extra: Record<string, unknown> = {},
  ): Inbound => ({
    kind: 'event',
    e: {
      tenant_id: 'acme',
      agent_id: 'a1',
      session_id: id,
      task_id: id,
      type,
      event_id: eventId,
      ts: ts++,
      ...extra,
    } as ToolCallsEvent,
    partition: 0,
    offset: String(offset),
  });
}

/** A fresh keyspace and flows topic; two stores over the same Redis stand for two writers. */
export async function place(policy: Omit<PromotionPolicy, 'mode' | 'minSavings'>) {
  const prefix = unique('race');
  const flowsTopic = unique('flows');
  const stateTopic = unique('flows-state');
  await createTopics([
    { topic: flowsTopic, partitions: 1, compacted: true },
    { topic: stateTopic, partitions: 1, compacted: true },
  ]);
  await sink.connect();
  // Both writers send candidate states to the state topic before Redis, as the service does.
  const states = stateWriter(sink, stateTopic, new CandidateStates());
  return {
    prefix,
    flowsTopic,
    stateTopic,
    policy: { mode: 'auto', minSavings: 0, ...policy } satisfies PromotionPolicy,
    store: new RedisFlowStore(redis, prefix, states),
    other: new RedisFlowStore(redis, prefix, states),
  };
}
