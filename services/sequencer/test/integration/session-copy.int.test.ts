import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { jsonCodec } from '../../../../shared/codec.js';
import type { InboundRecord } from '../../../../shared/kafka/chunk.js';
import { createSink } from '../../../../shared/kafka/sink.js';
import { createTopics, testKafka, testRedis, unique } from '../../../../test/helpers/kafka.js';
import { createBatchHandler } from '../../src/adapters/batch.js';
import {
  copyToSessionLog,
  readSessionLog,
  type LoggedSession,
} from '../../src/adapters/kafka/session-log.js';
import { createSequencerMetrics } from '../../src/adapters/metrics.js';
import { RedisSessionStore, sessionKey } from '../../src/adapters/redis/store.js';
import { Orchestrations } from '../../src/core/orchestration.js';

const redis = testRedis();
const sink = createSink(testKafka(), jsonCodec());
afterAll(async () => {
  await sink.disconnect();
  redis.disconnect();
});

const ref = { tenant: 't', agent: 'a', session: 's' };
const ev = (i: number): InboundRecord<ToolCallsEvent> => ({
  topic: 'in',
  partition: 0,
  offset: String(i),
  key: 's',
  timestamp: '0',
  value: {
    type: 'tool_call',
    event_id: `e${i}`,
    ts: i,
    tenant_id: ref.tenant,
    agent_id: ref.agent,
    session_id: ref.session,
    task_id: 'k',
    step: i,
    tool: `tool${i}`,
    // No orchestration here: what the agent was shown is what the sequencer publishes records over.
    visible_tools: [`tool${i}`],
  },
});
const ctx = { heartbeat: async () => undefined, isRunning: () => true };

describe('session copy vs a write that lost its compare-and-set (real Kafka and Redis)', () => {
  for (const recopyFails of [false, true])
    it(`the last record of a session on the session topic is what Redis holds, so a restore after a loss gives it back${recopyFails ? ' (the copy after the lost write failed once: the retry sends it)' : ''}`, async () => {
      const prefix = unique('copyrace');
      const [out, stateTopic] = [unique('seq-out'), unique('seq-sessions')];
      await createTopics([{ topic: out }, { topic: stateTopic, compacted: true }]);
      await sink.connect();
      const copy = copyToSessionLog(sink, stateTopic, prefix);
      const handler = (c: typeof copy) =>
        createBatchHandler({
          config: new Orchestrations(),
          store: new RedisSessionStore(redis, prefix, 60_000),
          sink,
          topic: out,
          metrics: createSequencerMetrics(
            new Registry(),
            () => 0,
            () => 0,
            () => false,
          ),
          copy: c,
        });
      // A rebalance overlap: the old owner A read the session, then was slow to publish; meanwhile the new owner B,
      // from the same committed offset, fetched more of the partition and handled it all. A's copy lands last.
      const B = handler(copy);
      let calls = 0;
      const A = handler(async (writes) => {
        calls++;
        if (calls === 1) await B([ev(0), ev(1), ev(2), ev(3)], ctx);
        if (calls === 2 && recopyFails) throw new Error('broker unreachable for a moment');
        await copy(writes);
      });
      await expect(A([ev(0), ev(1)], ctx)).rejects.toMatchObject({ code: 'STATE_CONTENDED' });
      // The runner's retry from fresh state: every event is a duplicate now, nothing is written.
      await A([ev(0), ev(1)], ctx);

      const held = await redis.get(sessionKey(prefix, ref));
      const logged: LoggedSession[] = [];
      await readSessionLog(
        {
          kafka: testKafka(),
          topic: stateTopic,
          groupPrefix: unique('copyrace-read'),
          sessionTimeoutMs: 10_000,
          maxBytesPerPartition: 1 << 20,
        },
        prefix,
        async (sessions) => void logged.push(...sessions),
      );
      expect(logged.length).toBeGreaterThanOrEqual(2);
      // Compaction keeps the last record; a restore of the whole topic lets the later of two at one version win.
      expect(logged.at(-1)!.value).toBe(held);

      // The loss and the restore, as main runs it: the session comes back as Redis held it.
      const store = new RedisSessionStore(redis, prefix, 60_000);
      await redis.del(sessionKey(prefix, ref));
      await store.restore(logged.map((s) => ({ ref: s.ref, value: s.value, ttlMs: 60_000 })));
      expect(await redis.get(sessionKey(prefix, ref))).toBe(held);
    });
});

describe('redelivered events counted once a batch is done (real Kafka and Redis)', () => {
  it('a batch that fails and is run again counts its duplicates once', async () => {
    const prefix = unique('dupcount');
    const out = unique('seq-out');
    await createTopics([{ topic: out }]);
    await sink.connect();
    const registry = new Registry();
    const metrics = createSequencerMetrics(
      registry,
      () => 0,
      () => 0,
      () => false,
    );
    let failSends = 0;
    const handler = createBatchHandler({
      config: new Orchestrations(),
      store: new RedisSessionStore(redis, prefix, 60_000),
      // The real sink, failing while `failSends` lasts (a broker outage): the runner runs the batch again.
      sink: {
        ...sink,
        send: (...a: Parameters<typeof sink.send>) =>
          failSends-- > 0 ? Promise.reject(new Error('broker unavailable')) : sink.send(...a),
      },
      topic: out,
      metrics,
    });
    await handler([ev(0), ev(1)], ctx);
    // e0 and e1 again (redelivered), with a new e2; the first two attempts fail at the publish.
    failSends = 2;
    for (let attempt = 0; attempt < 2; attempt++)
      await expect(handler([ev(0), ev(1), ev(2)], ctx)).rejects.toThrow('broker unavailable');
    await handler([ev(0), ev(1), ev(2)], ctx);
    const counted = (await registry.getSingleMetric('paver_sequencer_redelivered_events_total')!.get())
      .values[0]!.value;
    // Before: 6, the two duplicates counted by every attempt.
    expect(counted).toBe(2);
  });
});
