/** What every bench scenario shares: one local stack, a backlog producer, the bare-consumer baseline, a service process. */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { CompressionTypes, Kafka, logLevel, Partitioners, type Producer } from 'kafkajs';
import { Redis } from 'ioredis';
import { freePort, packageRoot, type Stack } from '../deploy/local/stack.js';
import { commonEnvShape } from '../shared/config.js';
import { keyedPartitioner } from '../shared/kafka/partitioner.js';
import { PRODUCE_REQUEST_MAX_RECORDS } from '../shared/kafka/sink.js';

/** The services' partition concurrency (their default unless the bench's environment sets one): the baselines use it too. */
export const concurrency = (): number =>
  commonEnvShape.KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY.parse(
    process.env.KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY,
  );

export const say = (s: string) => process.stderr.write(`bench: ${s}\n`);

export const pct = (xs: number[], p: number): number | null => {
  const s = Float64Array.from(xs).sort();
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]! : null;
};
export const round = (x: number | null, digits = 3) => (x === null ? null : Number(x.toFixed(digits)));
/** The p50 and p99 every figure reports, rounded alike. */
export const quantiles = (xs: number[], digits = 3) => ({
  p50: round(pct(xs, 50), digits),
  p99: round(pct(xs, 99), digits),
});

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

/** A consumer's speed over a backlog, and the time it spent per fetched batch (its eachBatch call). */
export interface Rate {
  events_per_s: number;
  /**
   * CPU time of the consuming process per event (user + system), over the same interval. Other processes
   * sharing the cores slow the wall clock far more than they change this, so it is the steadier figure.
   */
  cpu_us_per_event: number;
  batch_ms: { p50: number | null; p99: number | null; batches: number };
}

const rateOf = (count: number, ms: number, cpuUs: number, batchMs: number[]): Rate => ({
  events_per_s: Math.round(count / (ms / 1000)),
  cpu_us_per_event: round(cpuUs / count, 2)!,
  batch_ms: { ...quantiles(batchMs), batches: batchMs.length },
});

/**
 * A bare kafkajs consumer over the backlog: eachBatch, then `work` per batch. Its clock starts at the first
 * batch (as the service's does) and stops when `count` messages have been seen.
 */
async function bareConsumer(
  b: Bench,
  topic: string,
  group: string,
  count: number,
  work: (messages: { key: Buffer | null; value: Buffer | null }[]) => Promise<void>,
): Promise<Rate> {
  const bare = b.kafka.consumer({ groupId: group, maxWaitTimeInMs: 200 });
  await bare.connect();
  await bare.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  let start = 0;
  let cpu0 = process.cpuUsage();
  let cpuUs = 0;
  const batchMs: number[] = [];
  const end = await new Promise<number>((resolve) => {
    void bare.run({
      partitionsConsumedConcurrently: concurrency(),
      eachBatch: async ({ batch }) => {
        const t = performance.now();
        if (!start) {
          start = Date.now();
          cpu0 = process.cpuUsage();
        }
        await work(batch.messages);
        seen += batch.messages.length;
        batchMs.push(performance.now() - t);
        if (seen >= count) {
          const c = process.cpuUsage(cpu0);
          cpuUs = c.user + c.system;
          resolve(Date.now());
        }
      },
    });
  });
  await bare.disconnect();
  return rateOf(count, end - start, cpuUs, batchMs);
}

/** The first baseline: a bare kafkajs consumer (eachBatch, JSON.parse, nothing else) over the same backlog. */
export async function bareRate(b: Bench, topic: string, count: number): Promise<Rate> {
  const r = await bareConsumer(b, topic, `${topic}-bare`, count, async (messages) => {
    for (const m of messages) JSON.parse(m.value!.toString());
  });
  say(`bare kafkajs over ${topic}: ${r.events_per_s} events/s, ${r.cpu_us_per_event} µs CPU/event`);
  return r;
}

/**
 * The second baseline, for services that publish one record per input: a bare kafkajs pipe (eachBatch,
 * JSON.parse, one output record per input, produced per batch with the sink's settings: acks all, no
 * compression). What a service could reach with no work of its own and the same Kafka client.
 *
 * `tuned` is the same pipe producing as the sink does (shared/kafka/sink.ts): keys partitioned by
 * keyedPartitioner (the same partitions as kafkajs's default, without its per-message BigInt murmur2), JSON
 * text values with no Buffer or empty headers object per record, requests of at most
 * PRODUCE_REQUEST_MAX_RECORDS. Not what a bare kafkajs user writes, so the plain pipe stays the baseline; the
 * tuned one shows what the sink's producing costs on top of kafkajs's own.
 */
async function pipeRateOf(
  b: Bench,
  topic: string,
  outTopic: string,
  count: number,
  tuned: boolean,
): Promise<Rate> {
  const producer = b.kafka.producer({
    createPartitioner: tuned ? keyedPartitioner() : Partitioners.DefaultPartitioner,
    allowAutoTopicCreation: false,
  });
  await producer.connect();
  try {
    // Named, so that a CPU profile of the bench (node --cpu-prof) can find the pipe's phase.
    async function pipeBatch(messages: { value: Buffer | null }[]) {
      const out = messages.map((m) => {
        const e = JSON.parse(m.value!.toString()) as { session_id: string; event_id: string };
        return { key: e.session_id, value: JSON.stringify({ event_id: e.event_id, piped: true }) };
      });
      await producer.send({ topic: outTopic, messages: out, acks: -1, compression: CompressionTypes.None });
    }
    async function tunedPipeBatch(messages: { value: Buffer | null }[]) {
      const out = messages.map((m) => {
        const e = JSON.parse(m.value!.toString()) as { session_id: string; event_id: string };
        return { key: e.session_id, value: JSON.stringify({ event_id: e.event_id, piped: true }) };
      });
      for (let i = 0; i < out.length; i += PRODUCE_REQUEST_MAX_RECORDS) {
        const request =
          out.length <= PRODUCE_REQUEST_MAX_RECORDS ? out : out.slice(i, i + PRODUCE_REQUEST_MAX_RECORDS);
        await producer.send({
          topic: outTopic,
          messages: request,
          acks: -1,
          compression: CompressionTypes.None,
        });
      }
    }
    const r = await bareConsumer(
      b,
      topic,
      `${topic}-pipe${tuned ? '-tuned' : ''}`,
      count,
      tuned ? tunedPipeBatch : pipeBatch,
    );
    say(
      `bare kafkajs pipe${tuned ? ' (tuned as the sink)' : ''} over ${topic}: ${r.events_per_s} events/s, ${r.cpu_us_per_event} µs CPU/event`,
    );
    return r;
  } finally {
    await producer.disconnect();
  }
}

/** Both pipes over the same backlog, one after the other: the plain one, with the tuned one beside it. */
export async function pipeRate(
  b: Bench,
  topic: string,
  outTopic: string,
  count: number,
): Promise<Rate & { tuned: Rate }> {
  const plain = await pipeRateOf(b, topic, outTopic, count, false);
  return { ...plain, tuned: await pipeRateOf(b, topic, outTopic, count, true) };
}

/**
 * The machine's load while `fn` runs: os.loadavg()'s 1-minute figure sampled every second (other processes
 * share the cores, so a figure means little without it).
 */
export async function underLoad<R>(fn: () => Promise<R>): Promise<{ result: R; load: LoadFigure }> {
  const samples: number[] = [loadavg()[0]!];
  const timer = setInterval(() => samples.push(loadavg()[0]!), 1000);
  try {
    const result = await fn();
    samples.push(loadavg()[0]!);
    return {
      result,
      load: {
        loadavg_1m_mean: round(samples.reduce((a, x) => a + x, 0) / samples.length, 2),
        loadavg_1m_max: round(Math.max(...samples), 2),
        cores: cpus().length,
      },
    };
  } finally {
    clearInterval(timer);
  }
}
export interface LoadFigure {
  loadavg_1m_mean: number | null;
  loadavg_1m_max: number | null;
  cores: number;
}

/** A quantile of a Prometheus histogram (linear within the bucket, as histogram_quantile does), in ms. */
export function histogramQuantileMs(metricsText: string, name: string, q: number): number | null {
  const buckets = new Map<number, number>();
  for (const line of metricsText.split('\n')) {
    if (!line.startsWith(`${name}_bucket{`)) continue;
    const le = /le="([^"]+)"/.exec(line)?.[1];
    if (!le) continue;
    const bound = le === '+Inf' ? Infinity : Number(le);
    buckets.set(bound, (buckets.get(bound) ?? 0) + Number(line.split(' ').pop()));
  }
  const sorted = [...buckets].sort((a, b) => a[0] - b[0]);
  const total = sorted.at(-1)?.[1] ?? 0;
  if (!total) return null;
  const rank = q * total;
  let prevBound = 0;
  let prevCount = 0;
  for (const [bound, count] of sorted) {
    if (count >= rank) {
      if (bound === Infinity) return round(prevBound * 1000);
      const within = count === prevCount ? 0 : (rank - prevCount) / (count - prevCount);
      return round((prevBound + (bound - prevBound) * within) * 1000);
    }
    prevBound = bound;
    prevCount = count;
  }
  return null;
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

/**
 * Events/s from the first consumed event until `count` are consumed, read off the service's own metrics, and
 * its per-batch processing time (paver_batch_processing_seconds: decode to committed effects).
 */
export async function serviceRate(p: ServiceProc, count: number): Promise<Rate> {
  let start = 0;
  let cpu0 = 0;
  for (;;) {
    if (p.child.exitCode !== null) throw new Error('service exited during the bench');
    const consumed = await p.metric('paver_events_consumed_total').catch(() => 0);
    if (consumed > 0 && !start) {
      start = Date.now();
      cpu0 = await p.metric('process_cpu_seconds_total');
    }
    if (consumed >= count) break;
    // Every scrape costs the service CPU the bare consumer never pays (at 20 ms, ~10 µs per event in the
    // detector's profile): 100 ms keeps that small and the start/end error within 100 ms of a multi-second run.
    await sleep(100);
  }
  const ms = Date.now() - start;
  const cpuUs = ((await p.metric('process_cpu_seconds_total')) - cpu0) * 1e6;
  const text = await (await fetch(`http://127.0.0.1:${p.port}/metrics`)).text();
  const h = 'paver_batch_processing_seconds';
  const batches = text
    .split('\n')
    .filter((l) => l.startsWith(`${h}_count`))
    .reduce((a, l) => a + Number(l.split(' ').pop()), 0);
  return {
    events_per_s: Math.round(count / (ms / 1000)),
    cpu_us_per_event: round(cpuUs / count, 2)!,
    batch_ms: {
      p50: histogramQuantileMs(text, h, 0.5),
      p99: histogramQuantileMs(text, h, 0.99),
      batches,
    },
  };
}

/** One throughput figure: the service against each baseline, in the same run, with the machine's load. */
export function ratios(service: Rate, bare: Rate, pipeRates?: Rate & { tuned?: Rate }) {
  const { tuned: tunedPipe, ...plain } = pipeRates ?? {};
  const pipe = pipeRates ? (plain as Rate) : undefined;
  const cpu = (base: Rate) => Number((base.cpu_us_per_event / service.cpu_us_per_event).toFixed(3));
  return {
    ratio_to_bare: Number((service.events_per_s / bare.events_per_s).toFixed(3)),
    ...(pipe ? { ratio_to_pipe: Number((service.events_per_s / pipe.events_per_s).toFixed(3)) } : {}),
    // The same ratios in CPU time per event (baseline ÷ service): what the service would reach on idle cores.
    cpu_ratio_to_bare: cpu(bare),
    ...(pipe ? { cpu_ratio_to_pipe: cpu(pipe) } : {}),
    ...(tunedPipe ? { cpu_ratio_to_tuned_pipe: cpu(tunedPipe) } : {}),
    // The pipes against the bare consumer: the ceiling kafkajs's producer sets for a service that publishes.
    ...(pipe
      ? { pipe_cpu_ratio_to_bare: Number((bare.cpu_us_per_event / pipe.cpu_us_per_event).toFixed(3)) }
      : {}),
    ...(tunedPipe
      ? {
          tuned_pipe_cpu_ratio_to_bare: Number(
            (bare.cpu_us_per_event / tunedPipe.cpu_us_per_event).toFixed(3),
          ),
        }
      : {}),
    service,
    bare_kafkajs: bare,
    ...(pipe ? { bare_kafkajs_pipe: pipe } : {}),
    ...(tunedPipe ? { bare_kafkajs_pipe_tuned: tunedPipe } : {}),
  };
}

/** The runner settings a figure was measured with (the service's defaults unless BENCH_ENV overrides them). */
export function benchConfig(): Record<string, string | number> {
  return {
    partitions_consumed_concurrently: concurrency(),
    ...Object.fromEntries(
      Object.entries(process.env).filter(
        ([k]) => k.startsWith('KAFKA_PARTITIONS') || k.startsWith('PAVER_BATCH') || k === 'BENCH_PROFILE',
      ) as [string, string][],
    ),
  };
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
