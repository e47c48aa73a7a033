import { afterAll, describe, expect, it } from 'vitest';
import { createTopics, groupCaughtUp, produce, testRedis, unique, waitFor } from '../helpers/kafka.js';
import { getJson, isReady, serviceEnv, startProcess, type Proc } from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';

const FIXTURE = ['--import', 'tsx', 'test/fixtures/recorder-service.ts'];
const redis = testRedis();
const procs: Proc[] = [];
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  redis.disconnect();
});

const event = (i: number) => ({
  type: 'tool_call',
  event_id: `e${i}`,
  ts: 1_700_000_000_000 + i,
  session_id: `s${i % 7}`,
  task_id: `t${i % 5}`,
  step: i,
  tool: 'search',
});

describe('consumer runner: a chunk whose effect outlasts the session timeout', () => {
  it('keeps its group membership while the handler works (no eviction, no redelivery loop)', async () => {
    // A handler that never heartbeats itself (a slow model call per request, a slow Redis) and takes 1.5 session
    // timeouts: the runner must keep the member alive, or the broker evicts it, the commit fails, the chunk is
    // read again and takes as long again, for good.
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      KAFKA_SESSION_TIMEOUT_MS: '6000',
      FIXTURE_DELAY_MS: '9000',
    });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      Array.from({ length: 20 }, (_, i) => ({ key: 's', value: JSON.stringify(event(i)) })),
    );
    const p = await startProcess(FIXTURE, env);
    procs.push(p);
    await waitFor(() => isReady(p), 'recorder /readyz').catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output()}`);
    });
    await waitFor(
      () => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'the slow chunk committed',
      45_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output().slice(-3000)}`);
    });
    const deliveries = await redis.hgetall(`${env.REDIS_KEY_PREFIX}:deliveries`);
    expect(Object.keys(deliveries)).toHaveLength(20);
    expect(Object.values(deliveries).every((n) => n === '1')).toBe(true);
    const metrics = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    // One join, no rebalance forced by an eviction.
    expect(metrics.value('paver_consumer_rebalances_total')).toBe(1);
  });
});
