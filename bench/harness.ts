/** What every bench scenario shares: one local stack, a backlog producer, the bare-consumer baseline, a service process. */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Kafka, logLevel, Partitioners, type Producer } from 'kafkajs';
import { Redis } from 'ioredis';
import { freePort, packageRoot, type Stack } from '../deploy/local/stack.js';

export const say = (s: string) => process.stderr.write(`bench: ${s}\n`);

export const pct = (xs: number[], p: number): number | null => {
  const s = Float64Array.from(xs).sort();
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]! : null;
};
export const round = (x: number | null, digits = 3) => (x === null ? null : Number(x.toFixed(digits)));

export interface Bench {
  stack: Stack;
  kafka: Kafka;
  redis: Redis;
  producer: Producer;
}

export async function benchContext(stack: Stack): Promise<Bench> {
  const kafka = new Kafka({ clientId: 'bench', brokers: [stack.brokers], logLevel: logLevel.NOTHING });
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  return { stack, kafka, redis: new Redis(stack.redisUrl), producer };
}

export async function createTopics(b: Bench, topics: { topic: string; compacted?: boolean }[]) {
  const admin = b.kafka.admin();
  await admin.connect();
  await admin.createTopics({
    waitForLeaders: true,
    topics: topics.map((t) => ({
      topic: t.topic,
      numPartitions: 3,
      configEntries: t.compacted ? [{ name: 'cleanup.policy', value: 'compact' }] : [],
    })),
  });
  await admin.disconnect();
}

/** Sends events keyed by session_id in batches of 2,000; returns how many were sent. */
export async function produceBacklog(
  b: Bench,
  topic: string,
  events: Iterable<{ session_id: string }>,
  limit: number,
): Promise<number> {
  let batch: { key: string; value: string }[] = [];
  let sent = 0;
  const t0 = Date.now();
  for (const e of events) {
    if (sent + batch.length >= limit) break;
    batch.push({ key: e.session_id, value: JSON.stringify(e) });
    if (batch.length === 2000) {
      await b.producer.send({ topic, messages: batch, acks: -1 });
      sent += batch.length;
      batch = [];
    }
  }
  if (batch.length) await b.producer.send({ topic, messages: batch, acks: -1 });
  sent += batch.length;
  say(`produced ${sent} events to ${topic} in ${Date.now() - t0} ms`);
  return sent;
}

/** The baseline: a bare kafkajs consumer (eachBatch, JSON.parse, nothing else) over the same backlog. */
export async function bareRate(b: Bench, topic: string, count: number): Promise<number> {
  const bare = b.kafka.consumer({ groupId: `${topic}-bare`, maxWaitTimeInMs: 200 });
  await bare.connect();
  await bare.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  let start = 0;
  const end = await new Promise<number>((resolve) => {
    void bare.run({
      eachBatch: async ({ batch }) => {
        if (!start) start = Date.now();
        for (const m of batch.messages) JSON.parse(m.value!.toString());
        seen += batch.messages.length;
        if (seen >= count) resolve(Date.now());
      },
    });
  });
  await bare.disconnect();
  const rate = count / ((end - start) / 1000);
  say(`bare kafkajs over ${topic}: ${Math.round(rate)} events/s`);
  return rate;
}

export interface ServiceProc {
  child: ChildProcess;
  port: number;
  metric: (name: string) => Promise<number>;
  stop: () => Promise<void>;
}

/** Starts `paver run NAME` as a real process against the bench stack. */
export async function startService(
  b: Bench,
  name: string,
  env: Record<string, string>,
): Promise<ServiceProc> {
  const port = await freePort();
  const child = spawn(
    process.execPath,
    [
      ...(process.env.BENCH_PROFILE ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_PROFILE] : []),
      join(packageRoot(), 'bin', 'paver.js'),
      'run',
      name,
    ],
    {
      env: {
        ...process.env,
        KAFKA_BROKERS: b.stack.brokers,
        REDIS_URL: b.stack.redisUrl,
        HTTP_PORT: String(port),
        LOG_LEVEL: 'warn',
        ...env,
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  const metric = async (m: string) => {
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    return text
      .split('\n')
      .filter((l) => l.startsWith(m) && (l[m.length] === ' ' || l[m.length] === '{'))
      .reduce((a, l) => a + Number(l.split(' ').pop()), 0);
  };
  const stop = async () => {
    if (child.exitCode !== null) return;
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
  };
  return { child, port, metric, stop };
}

/** Events/s from the first consumed event until `count` are consumed, read off the service's own metrics. */
export async function serviceRate(p: ServiceProc, count: number): Promise<number> {
  let start = 0;
  for (;;) {
    if (p.child.exitCode !== null) throw new Error('service exited during the bench');
    const consumed = await p.metric('paver_events_consumed_total').catch(() => 0);
    if (consumed > 0 && !start) start = Date.now();
    if (consumed >= count) break;
    await sleep(20);
  }
  return count / ((Date.now() - start) / 1000);
}

export const redisInfo = async (redis: Redis, section: string, field: string) =>
  Number(new RegExp(`${field}:(\\d+)`).exec(await redis.info(section))?.[1] ?? 0);

export function writeResult(name: string, result: Record<string, unknown>) {
  const full = {
    measured_at: new Date().toISOString(),
    machine: { cores: cpus().length, node: process.version },
    ...result,
  };
  mkdirSync(join(packageRoot(), 'bench', 'results'), { recursive: true });
  writeFileSync(
    join(packageRoot(), 'bench', 'results', `${name}.json`),
    JSON.stringify(full, null, 2) + '\n',
  );
  process.stdout.write(`${name}: ${JSON.stringify(full)}\n`);
}
