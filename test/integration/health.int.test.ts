import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import { afterAll, describe, expect, it } from 'vitest';
import { startKafka } from '../../deploy/local/stack.js';
import { produce, testRedis, unique, waitFor } from '../helpers/kafka.js';
import {
  explained,
  getJson,
  killAll,
  serviceEnv,
  startProcess,
  startReady,
  type Proc,
} from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';
import { createRecorderTopics, RECORDER, recorderEvent as event } from '../helpers/recorder.js';

const redis = testRedis();
const procs: Proc[] = [];
const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  await killAll(procs);
  for (const c of cleanups) await c().catch(() => undefined);
  redis.disconnect();
});

async function readyz(p: Proc): Promise<{ status: number; checks: Record<string, boolean> }> {
  const r = await getJson(p.url('/readyz'));
  return { status: r.status, checks: (r.body as { checks: Record<string, boolean> }).checks };
}
const metrics = async (p: Proc) => parsePrometheus(String((await getJson(p.url('/metrics'))).body));

describe('truthful health (real Kafka, real processes)', () => {
  it('shows a stalled partition its lag and the age of its oldest event, while the others flow', async () => {
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      PAVER_LAG_POLL_MS: '500',
      KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY: '3',
    });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    await createRecorderTopics(env, 3);
    const prefix = env.REDIS_KEY_PREFIX!;
    await redis.set(`${prefix}:stall`, '1');
    await produce(
      topic,
      Array.from({ length: 300 }, (_, i) => ({
        key: `s${i}`,
        value: JSON.stringify(event(i)),
        partition: i % 3,
      })),
    );
    const p = await startProcess(RECORDER, env);
    procs.push(p);
    await explained(
      p,
      waitFor(async () => (await redis.scard(`${prefix}:seen`)) === 200, 'partitions 0 and 2'),
    );
    const stalled = await explained(
      p,
      waitFor(async () => {
        const m = await metrics(p);
        const lag = (partition: string) => m.value('paver_consumer_lag', { topic, partition });
        const age0 = m.value('paver_consumer_oldest_unprocessed_age_seconds', { topic, partition: '0' });
        return lag('1') === 100 && lag('0') === 0 && lag('2') === 0 && age0 === 0 ? m : null;
      }, 'lag 100 on the stalled partition, lag and age 0 elsewhere'),
    );
    // The stalled partition's oldest event was produced before the test started waiting: its age is > 0.
    const age = (m: typeof stalled, partition: string) =>
      m.value('paver_consumer_oldest_unprocessed_age_seconds', { topic, partition });
    await waitFor(async () => age(await metrics(p), '1') > 1, 'the oldest event ages');
    expect(age(stalled, '0')).toBe(0);
    // A slow partition is not an unhealthy process: readiness stays true.
    expect((await readyz(p)).status).toBe(200);

    await redis.del(`${prefix}:stall`);
    await waitFor(async () => (await redis.scard(`${prefix}:seen`)) === 300, 'the stalled partition');
    await waitFor(async () => {
      const m = await metrics(p);
      return m.value('paver_consumer_lag', { topic, partition: '1' }) === 0 && age(m, '1') === 0;
    }, 'lag and age back to 0');
  });

  it('/readyz is false while the broker is down and true again once it is back; nothing is lost', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-health-kafka-'));
    let broker = await startKafka({ dir });
    cleanups.push(async () => {
      await broker.stop();
      rmSync(dir, { recursive: true, force: true });
    });
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      KAFKA_BROKERS: broker.brokers,
      PAVER_LAG_POLL_MS: '500',
    });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const admin = new Kafka({ clientId: 't', brokers: [broker.brokers], logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    await admin.createTopics({
      waitForLeaders: true,
      topics: [topic, env.PAVER_TOPIC_DEAD_LETTERS!].map((t) => ({ topic: t, numPartitions: 3 })),
    });
    await admin.disconnect();
    const send = async (from: number, n: number) => {
      const k = new Kafka({ clientId: 't', brokers: [broker.brokers], logLevel: logLevel.NOTHING });
      const producer = k.producer();
      await producer.connect();
      await producer.send({
        topic,
        acks: -1,
        messages: Array.from({ length: n }, (_, i) => ({
          key: `s${from + i}`,
          value: JSON.stringify(event(from + i)),
        })),
      });
      await producer.disconnect();
    };
    await send(0, 50);
    const p = await startReady(RECORDER, env, procs, 90_000);
    const prefix = env.REDIS_KEY_PREFIX!;
    await waitFor(async () => (await redis.scard(`${prefix}:seen`)) === 50, 'the first 50');

    const t0 = Date.now();
    await broker.stop();
    const down = await explained(
      p,
      waitFor(async () => {
        const r = await readyz(p);
        return r.status === 503 && !r.checks.kafka_broker ? r : null;
      }, '/readyz 503 with the broker down'),
    );
    expect(down.checks.kafka_consumer).toBe(false);
    expect(p.child.exitCode).toBeNull();

    const t1 = Date.now();
    broker = await startKafka({ dir, port: broker.port, controllerPort: broker.controllerPort });
    const t2 = Date.now();
    await explained(
      p,
      waitFor(async () => (await readyz(p)).status === 200, '/readyz 200 with the broker back', 120_000),
    );
    // Figures for the record, not assertions: timing depends on the machine.
    process.stderr.write(
      `[health] readyz false ${t1 - t0} ms after the broker stop began; true ${Date.now() - t2} ms after the broker was back\n`,
    );
    await send(50, 50);
    await waitFor(async () => (await redis.scard(`${prefix}:seen`)) === 100, 'all 100 events', 120_000);
    expect(p.child.exitCode).toBeNull();
  }, 360_000);
});
