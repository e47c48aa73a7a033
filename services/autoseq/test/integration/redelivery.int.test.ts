import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import {
  catalogPolicyV1,
  catalogToolV1,
  type NextActionRecord,
  type ToolCallsEvent,
} from '../../../../schemas/index.js';
import type { InboundRecord } from '../../../../shared/kafka/chunk.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createMetrics } from '../../../../shared/metrics.js';
import { consumeUntil, createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createBatchHandler } from '../../src/adapters/batch.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { RedisLearnStore } from '../../src/adapters/redis/learn-store.js';
import { RedisTaskStore, taskKey } from '../../src/adapters/redis/task-store.js';
import { Catalog } from '../../src/core/catalog.js';
import { DEFAULT_OPTIONS, newTaskState } from '../../src/core/decide.js';
import { DEFAULT_LEARN } from '../../src/core/learn/learner.js';
import { SchemaCompiler } from '../../src/core/schema-compiler.js';

function catalog(): Catalog {
  const c = new Catalog(new SchemaCompiler());
  c.loadAgent({
    tenant_id: 'default',
    agent_id: 'default',
    tools: [
      catalogToolV1.parse({
        name: 'init_docs',
        args_schema: {
          type: 'object',
          properties: { route: { type: 'string' }, text: { type: 'string' } },
          required: ['route', 'text'],
        },
        side_effects: 'read',
        auto_seq: true,
        auto_seq_execute: true,
      }),
    ],
    policy: catalogPolicyV1.parse({ auto_seq_enabled: true, auto_seq_execute: true }),
  });
  return c;
}

/**
 * One task's 70 events (more than the 64 ids the typed state keeps), at consecutive offsets of one partition:
 * a decision, then its auto-executed call, by turns.
 */
function chunk(task: string): InboundRecord<ToolCallsEvent>[] {
  return Array.from({ length: 70 }, (_, i) => {
    const value: ToolCallsEvent = {
      type: 'tool_call',
      event_id: `${task}:${i}`,
      ts: 1_000 + i,
      tenant_id: 'default',
      agent_id: 'default',
      session_id: task,
      task_id: task,
      step: i,
      ...(i % 2 === 0
        ? { tool: 'triage', args: {}, observation: { route: 'docs', text: `q${i}` } }
        : {
            tool: 'init_docs',
            args: { route: 'docs', text: `q${i - 1}` },
            origin: 'auto_seq',
            observation: {},
          }),
    } as ToolCallsEvent;
    return {
      topic: 'tool-calls',
      partition: 2,
      offset: String(500 + i),
      key: task,
      timestamp: '0',
      value,
    };
  });
}

describe('autoseq redelivery of a chunk over the id window (real Redis and Kafka, the service batch handler)', () => {
  const redis = testRedis();
  const runtime = createMetrics('autoseq-test');
  const sink = createSink(testKafka(), jsonCodec(), runtime);
  afterAll(async () => {
    await sink.disconnect();
    await redis.quit();
  });
  const ctx = { heartbeat: async () => undefined, isRunning: () => true };

  for (const learning of [false, true])
    it(`a chunk handled again (state saved, offsets not committed) publishes nothing and saves no step twice (learning ${learning ? 'on' : 'off'})`, async () => {
      const prefix = unique('paver-test');
      const registry = new Registry();
      const metrics = createAutoseqMetrics(registry, () => 1);
      const topic = unique('next-actions');
      await createTopics([{ topic, partitions: 1 }]);
      await sink.connect();
      const published = async () =>
        (await runtime.published.get()).values.find((v) => v.labels.topic === topic)?.value ?? 0;
      const store = new RedisTaskStore(redis, prefix, 60_000);
      const handle = createBatchHandler({
        catalog: catalog(),
        store,
        loadLearn: learning
          ? (events, c) =>
              RedisLearnStore.load(redis, prefix, 60_000, DEFAULT_LEARN, events, {
                ttlMs: 10_000,
                heartbeat: c.heartbeat,
                isRunning: c.isRunning,
              })
          : null,
        taskKey: (ref) => taskKey(prefix, ref),
        opts: DEFAULT_OPTIONS,
        lopts: DEFAULT_LEARN,
        sink,
        topic,
        metrics,
      });
      const saved = async () => (await metrics.saved.get()).values[0]?.value ?? 0;
      const batch = chunk(unique('task'));

      await handle(batch, ctx);
      const count = await published();
      const first = (await consumeUntil(topic, (all) => all.length >= count)).map(
        (m) => JSON.parse(m.value!.toString()) as NextActionRecord,
      );
      expect(first.filter((r) => r.event_type === 'auto_seq_executed')).toHaveLength(35);
      const savedOnce = await saved();
      expect(savedOnce).toBe(35);

      // The same chunk again, as after a rebalance between the state write and the offset commit.
      await handle(batch, ctx);
      // Every send is acknowledged before the handler returns: the count is what reached the topic.
      expect(await published()).toBe(count);
      expect(await saved()).toBe(savedOnce);
      expect((await metrics.duplicates.get()).values[0]?.value).toBe(70);
    });

  for (const learning of [false, true])
    it(`a batch that fails and is run again counts its redelivered events once (learning ${learning ? 'on' : 'off'})`, async () => {
      const prefix = unique('paver-test');
      const registry = new Registry();
      const metrics = createAutoseqMetrics(registry, () => 1);
      const topic = unique('next-actions');
      await createTopics([{ topic, partitions: 1 }]);
      await sink.connect();
      let failSends = 0;
      const handle = createBatchHandler({
        catalog: catalog(),
        store: new RedisTaskStore(redis, prefix, 60_000),
        loadLearn: learning
          ? (events, c) =>
              RedisLearnStore.load(redis, prefix, 60_000, DEFAULT_LEARN, events, {
                ttlMs: 10_000,
                heartbeat: c.heartbeat,
                isRunning: c.isRunning,
              })
          : null,
        taskKey: (ref) => taskKey(prefix, ref),
        opts: DEFAULT_OPTIONS,
        lopts: DEFAULT_LEARN,
        // The real sink, failing while `failSends` lasts (a broker outage): the runner runs the batch again.
        sink: {
          ...sink,
          send: (...a: Parameters<typeof sink.send>) =>
            failSends-- > 0 ? Promise.reject(new Error('broker unavailable')) : sink.send(...a),
        },
        topic,
        metrics,
      });
      const events = chunk(unique('task')).slice(0, 3);
      await handle(events.slice(0, 2), ctx);
      // The first two again (redelivered) with a third; the first two attempts fail at the publish.
      failSends = 2;
      for (let attempt = 0; attempt < 2; attempt++)
        await expect(handle(events, ctx)).rejects.toThrow('broker unavailable');
      await handle(events, ctx);
      // Before: 6, the two duplicates counted by every attempt.
      expect((await metrics.duplicates.get()).values[0]?.value).toBe(2);
    });

  it('a task state that is not JSON (or not ours) reads as a fresh task: the batch goes on', async () => {
    const prefix = unique('paver-test');
    const store = new RedisTaskStore(redis, prefix, 60_000);
    const refs = new Map(
      ['garbage', 'number', 'wrong'].map((task) => [task, { tenant: 'default', agent: 'default', task }]),
    );
    await redis.set(taskKey(prefix, refs.get('garbage')!), '{"seen":["a"],'); // cut short
    await redis.set(taskKey(prefix, refs.get('number')!), '12');
    await redis.set(taskKey(prefix, refs.get('wrong')!), '{"seen":1}');
    // Before: the text cut short threw (JSON.parse) on every retry of the batch, a consumer stuck for good.
    const read = await store.load(refs);
    for (const task of refs.keys()) expect(read.get(task)).toEqual(newTaskState());
  });

  it('task state written before positions were kept reads as position unknown; a position saved reads back', async () => {
    const prefix = unique('paver-test');
    const store = new RedisTaskStore(redis, prefix, 60_000);
    const ref = { tenant: 'default', agent: 'default', task: 'old' };
    const old = { seen: ['a'], pending: null, consecutive: 0, last: null };
    await redis.set(taskKey(prefix, ref), JSON.stringify(old));
    const read = await store.load(new Map([['x', ref]]));
    expect(read.get('x')).toEqual(old);
    const at = { partition: 1, offset: '12345678901234567890' };
    await store.save(new Map([['x', { ref, state: { ...old, at } }]]));
    expect((await store.load(new Map([['x', ref]]))).get('x')).toEqual({ ...old, at });
  });
});
