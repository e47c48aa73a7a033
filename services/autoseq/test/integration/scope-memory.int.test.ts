import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import type { InboundRecord } from '../../../../shared/kafka/chunk.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createBatchHandler } from '../../src/adapters/batch.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { RedisLearnStore } from '../../src/adapters/redis/learn-store.js';
import { RedisTaskStore, taskKey } from '../../src/adapters/redis/task-store.js';
import { Catalog } from '../../src/core/catalog.js';
import { DEFAULT_OPTIONS } from '../../src/core/decide.js';
import { DEFAULT_LEARN } from '../../src/core/learn/learner.js';
import { SchemaCompiler } from '../../src/core/schema-compiler.js';

/*
 * Scope ids (tenant_id, agent_id) come from the producers, not from configuration: a runtime that puts a run id
 * in agent_id makes every run a new scope. What the service keeps in memory per scope must not grow with them.
 */
describe('autoseq memory per scope (real Redis and Kafka, the service batch handler)', () => {
  const redis = testRedis();
  const sink = createSink(testKafka(), jsonCodec());
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });

  it('a scope with no active rule keeps no entry in the active-rules gauge', async () => {
    const prefix = unique('paver-test');
    const registry = new Registry();
    const metrics = createAutoseqMetrics(registry, () => 0);
    const topic = unique('next-actions');
    await createTopics([{ topic, partitions: 1 }]);
    await sink.connect();
    const handle = createBatchHandler({
      catalog: new Catalog(new SchemaCompiler()),
      store: new RedisTaskStore(redis, prefix, 60_000),
      loadLearn: (events, c) =>
        RedisLearnStore.load(redis, prefix, 60_000, DEFAULT_LEARN, events, {
          ttlMs: 10_000,
          heartbeat: c.heartbeat,
          isRunning: c.isRunning,
        }),
      taskKey: (ref) => taskKey(prefix, ref),
      opts: DEFAULT_OPTIONS,
      lopts: DEFAULT_LEARN,
      sink,
      topic,
      metrics,
    });
    const batch: InboundRecord<ToolCallsEvent>[] = Array.from({ length: 500 }, (_, i) => ({
      topic: 'tool-calls',
      partition: 0,
      offset: String(i),
      key: `s${i}`,
      timestamp: '0',
      value: {
        type: 'tool_call',
        event_id: `e${i}`,
        ts: 1_000 + i,
        tenant_id: 'default',
        agent_id: `run-${i}`,
        session_id: `s${i}`,
        task_id: `t${i}`,
        step: 0,
        tool: 'search',
      },
    }));
    await handle(batch, { heartbeat: async () => undefined, isRunning: () => true });
    // Before, each of the 500 one-off scopes kept an entry (of 0) for the life of the process.
    expect(metrics.activeByScope.size).toBe(0);
    expect(await registry.getSingleMetricAsString('paver_autoseq_active_rules')).toMatch(
      /paver_autoseq_active_rules 0$/m,
    );
  });
});
