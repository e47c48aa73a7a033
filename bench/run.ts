/**
 * `npm run bench`: throughput and latency of the detector against a bare kafkajs consumer reading the same
 * topic, in the same run, on a local stack. Writes bench/results/detector.json. Figures, not assertions.
 */
import { spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Kafka, logLevel, Partitioners } from 'kafkajs';
import { Redis } from 'ioredis';
import { freePort, packageRoot, startStack } from '../deploy/local/stack.js';
import { agentEvents } from './streams.js';

const N = Number(process.env.BENCH_EVENTS ?? 200_000);
const say = (s: string) => process.stderr.write(`bench: ${s}\n`);
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]! : null;
};

const stack = await startStack({ log: say });
const kafka = new Kafka({ clientId: 'bench', brokers: [stack.brokers], logLevel: logLevel.NOTHING });
const redis = new Redis(stack.redisUrl);
const id = `bench-${Date.now().toString(36)}`;
const topic = `${id}.tool-calls`;
const candidatesTopic = `${id}.flow-candidates`;
try {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: 3 }, { topic: candidatesTopic, numPartitions: 3, configEntries: [{ name: 'cleanup.policy', value: 'compact' }] }, { topic: `${id}.dead-letters` }] });
  await admin.disconnect();

  // 1. Backlog: N events of a realistic mix (4 workflows + noise, 20 concurrent tasks, 4 agents).
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  let batch: { key: string; value: string }[] = [];
  let sent = 0;
  const t0 = Date.now();
  for (const e of agentEvents({ tasks: Math.ceil(N / 6.2), seed: 1, agents: 4 })) {
    if (sent + batch.length >= N) break;
    batch.push({ key: e.session_id, value: JSON.stringify(e) });
    if (batch.length === 2000) {
      await producer.send({ topic, messages: batch, acks: -1 });
      sent += batch.length;
      batch = [];
    }
  }
  await producer.send({ topic, messages: batch, acks: -1 });
  sent += batch.length;
  say(`produced ${sent} events in ${Date.now() - t0} ms`);

  // 2. Bare kafkajs consumer: eachBatch, JSON.parse, nothing else.
  const bare = kafka.consumer({ groupId: `${id}-bare`, maxWaitTimeInMs: 200 });
  await bare.connect();
  await bare.subscribe({ topic, fromBeginning: true });
  let bareCount = 0;
  let bareStart = 0;
  const bareDone = new Promise<number>((resolve) => {
    void bare.run({
      eachBatch: async ({ batch: b }) => {
        if (!bareStart) bareStart = Date.now();
        for (const m of b.messages) JSON.parse(m.value!.toString());
        bareCount += b.messages.length;
        if (bareCount >= sent) resolve(Date.now());
      },
    });
  });
  const bareEnd = await bareDone;
  await bare.disconnect();
  const bareRate = sent / ((bareEnd - bareStart) / 1000);
  say(`bare kafkajs: ${Math.round(bareRate)} events/s`);

  // 3. The detector over the same backlog, as a real process.
  const info = async (section: string, field: string) => Number(new RegExp(`${field}:(\\d+)`).exec(await redis.info(section))?.[1] ?? 0);
  const cmds0 = await info('stats', 'total_commands_processed');
  const mem0 = await info('memory', 'used_memory');
  const port = await freePort();
  const env = {
    ...process.env,
    KAFKA_BROKERS: stack.brokers,
    REDIS_URL: stack.redisUrl,
    REDIS_KEY_PREFIX: id,
    PAVER_TOPIC_TOOL_CALLS: topic,
    PAVER_TOPIC_FLOW_CANDIDATES: candidatesTopic,
    PAVER_TOPIC_DEAD_LETTERS: `${id}.dead-letters`,
    DETECTOR_GROUP_ID: `${id}-detector`,
    HTTP_PORT: String(port),
    LOG_LEVEL: 'warn',
  };
  const child = spawn(process.execPath, [join(packageRoot(), 'bin', 'paver.js'), 'run', 'detector'], { env, stdio: ['ignore', 'ignore', 'inherit'] });
  const metric = async (name: string) => {
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text().catch(() => '');
    return text.split('\n').filter((l) => l.startsWith(name)).reduce((a, l) => a + Number(l.split(' ').pop()), 0);
  };
  let detStart = 0;
  for (;;) {
    const consumed = await metric('paver_events_consumed_total').catch(() => 0);
    if (consumed > 0 && !detStart) detStart = Date.now();
    if (consumed >= sent) break;
    await sleep(50);
  }
  const detEnd = Date.now();
  const detRate = sent / ((detEnd - detStart) / 1000);
  const trips = await metric('paver_detector_redis_round_trips_total');
  const cmds = (await info('stats', 'total_commands_processed')) - cmds0;
  const windowRecords = (await Promise.all([0, 1, 2, 3].map((a) => redis.zcard(`${id}:det:{default|agent-${a}}:window`)))).reduce((a, b) => a + b, 0);
  const mem = (await info('memory', 'used_memory')) - mem0;
  say(`detector: ${Math.round(detRate)} events/s, ${trips} round trips, ${cmds} commands`);

  // 4. Latency: paced live traffic stamped with the wall clock; latency = candidate record's Kafka timestamp
  //    minus the ts of the newest task completion sent before it.
  const reader = kafka.consumer({ groupId: `${id}-lat`, maxWaitTimeInMs: 50 });
  await reader.connect();
  await reader.subscribe({ topic: candidatesTopic, fromBeginning: false });
  const completions: number[] = [];
  const latencies: number[] = [];
  await reader.run({
    eachMessage: async ({ message }) => {
      const at = Number(message.timestamp);
      const trigger = completions.filter((c) => c <= at).pop();
      if (trigger !== undefined) latencies.push(at - trigger);
    },
  });
  await sleep(2000);
  const live = agentEvents({ tasks: 400, seed: 99, agents: 1, concurrency: 5, startTs: Date.now() });
  for (const e of live) {
    const now = Date.now();
    await producer.send({ topic, messages: [{ key: e.session_id, value: JSON.stringify({ ...e, ts: now }) }], acks: 1 });
    if (e.type === 'task_completed') completions.push(now);
    await sleep(2);
  }
  await sleep(3000);
  await reader.disconnect();
  await producer.disconnect();
  child.kill('SIGTERM');
  await new Promise((r) => child.once('exit', r));

  const result = {
    measured_at: new Date().toISOString(),
    machine: { cores: (await import('node:os')).cpus().length, node: process.version },
    events: sent,
    bare_kafkajs_events_per_s: Math.round(bareRate),
    detector_events_per_s: Math.round(detRate),
    ratio_detector_to_bare: Number((detRate / bareRate).toFixed(3)),
    latency_ms: { p50: pct(latencies, 50), p99: pct(latencies, 99), samples: latencies.length, definition: 'candidate record timestamp − ts of the newest task_completed sent before it (paced live traffic)' },
    redis_round_trips_per_event: Number((trips / sent).toFixed(4)),
    redis_commands_per_event: Number((cmds / sent).toFixed(2)),
    redis_memory_bytes_per_window_record: windowRecords ? Math.round(mem / windowRecords) : null,
    window_records: windowRecords,
    targets: { ratio_min: 0.5, round_trips_per_event_max: 0.05 },
  };
  mkdirSync(join(packageRoot(), 'bench', 'results'), { recursive: true });
  writeFileSync(join(packageRoot(), 'bench', 'results', 'detector.json'), JSON.stringify(result, null, 2) + '\n');
  process.stdout.write(JSON.stringify(result, null, 2) + '\n');
} finally {
  redis.disconnect();
  await stack.stop();
}
