import { setTimeout as sleep } from 'node:timers/promises';
import { agentEvents } from '../testkit/streams.js';
import {
  bareRate,
  createTopics,
  ratios,
  underLoad,
  pct,
  produceBacklog,
  redisInfo,
  say,
  serviceRate,
  startService,
  writeResult,
  benchConfig,
  type Bench,
} from './harness.js';

/** Detector vs bare kafkajs over the same backlog; latency from a task's completion to its candidate. */
export async function benchDetector(b: Bench, n: number) {
  const id = `bench-det-${Date.now().toString(36)}`;
  const topic = `${id}.tool-calls`;
  const candidatesTopic = `${id}.flow-candidates`;
  await createTopics(b, [
    { topic },
    { topic: candidatesTopic, compacted: true },
    { topic: `${id}.dead-letters` },
  ]);
  // A realistic mix: 4 workflows + noise, 20 concurrent tasks, 4 agents (≈6 events per task).
  const sent = await produceBacklog(
    b,
    topic,
    agentEvents({ tasks: Math.ceil(n / 4), seed: 1, agents: 4 }),
    n,
  );
  const bare = await underLoad(() => bareRate(b, topic, sent));

  const cmds0 = await redisInfo(b.redis, 'stats', 'total_commands_processed');
  const redis0 = await redisTime(b, true);
  const mem0 = await redisInfo(b.redis, 'memory', 'used_memory');
  const p = await startService(b, 'detector', {
    REDIS_KEY_PREFIX: id,
    PAVER_TOPIC_TOOL_CALLS: topic,
    PAVER_TOPIC_FLOW_CANDIDATES: candidatesTopic,
    PAVER_TOPIC_DEAD_LETTERS: `${id}.dead-letters`,
    DETECTOR_GROUP_ID: `${id}-detector`,
  });
  const run = await underLoad(() => serviceRate(p, sent));
  const rate = run.result.events_per_s;
  const trips = await p.metric('paver_detector_redis_round_trips_total');
  const cmds = (await redisInfo(b.redis, 'stats', 'total_commands_processed')) - cmds0;
  const redis1 = await redisTime(b);
  const backlogSeconds = sent / rate;
  const scripts = await scriptsByTime(b);
  // The window is split over `window:<bucket>` zsets (layout v4); `window` itself in older layouts.
  const windowRecords = await windowRecordsOf(b, id);
  const mem = (await redisInfo(b.redis, 'memory', 'used_memory')) - mem0;
  const state = await stateBytes(b, id);
  say(
    `detector: ${rate} events/s, ${run.result.cpu_us_per_event} µs CPU/event, ${trips} round trips, ${cmds} commands`,
  );

  // Latency: paced live traffic stamped with the wall clock; latency = the candidate record's Kafka timestamp
  // minus the ts of the newest task completion sent before it.
  const reader = b.kafka.consumer({ groupId: `${id}-lat`, maxWaitTimeInMs: 50 });
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
  let paced = 0;
  for (const e of agentEvents({ tasks: 400, seed: 99, agents: 1, concurrency: 5, startTs: Date.now() })) {
    paced++;
    const now = Date.now();
    await b.producer.send({
      topic,
      messages: [{ key: e.session_id, value: JSON.stringify({ ...e, ts: now }) }],
      acks: 1,
    });
    if (e.type === 'task_completed') completions.push(now);
    await sleep(2);
  }
  await sleep(3000);
  await reader.disconnect();
  await p.stop();

  // Memory at a 10× window, the same backlog read again under a fresh prefix: used_memory growth then spreads
  // Redis's fixed overhead (script cache, first-use allocations: ~0.65 MB) over 10× the records, so it shows
  // what a window record costs as the window grows, not the overhead of a small one.
  const bigId = `${id}-big`;
  const bigMem0 = await redisInfo(b.redis, 'memory', 'used_memory');
  const big = await startService(b, 'detector', {
    REDIS_KEY_PREFIX: bigId,
    PAVER_TOPIC_TOOL_CALLS: topic,
    PAVER_TOPIC_FLOW_CANDIDATES: `${bigId}.candidates`,
    PAVER_TOPIC_DEAD_LETTERS: `${id}.dead-letters`,
    DETECTOR_GROUP_ID: `${bigId}-detector`,
    DETECTOR_LOOKBACK: '2000',
  });
  await serviceRate(big, sent + paced);
  await big.stop();
  const bigRecords = await windowRecordsOf(b, bigId);
  const bigMem = (await redisInfo(b.redis, 'memory', 'used_memory')) - bigMem0;
  const bigState = await stateBytes(b, bigId);

  writeResult('detector', {
    events: sent,
    bare_kafkajs_events_per_s: bare.result.events_per_s,
    detector_events_per_s: rate,
    ratio_detector_to_bare: Number((rate / bare.result.events_per_s).toFixed(3)),
    throughput: ratios(run.result, bare.result),
    load: { bare: bare.load, service: run.load },
    config: benchConfig(),
    latency_ms: {
      p50: pct(latencies, 50),
      p99: pct(latencies, 99),
      samples: latencies.length,
      definition:
        'candidate record timestamp − ts of the newest task_completed sent before it (paced live traffic)',
    },
    redis_round_trips_per_event: Number((trips / sent).toFixed(4)),
    redis_commands_per_event: Number((cmds / sent).toFixed(2)),
    // Where the backlog's time goes in Redis: its scripts (every EVALSHA, apply and publication) and its whole
    // CPU, per event, and the share of the backlog's wall time Redis was busy (the rest it waited on the service).
    redis_script_us_per_event: Number(((redis1.scriptUs - redis0.scriptUs) / sent).toFixed(2)),
    redis_script_calls: redis1.scriptCalls - redis0.scriptCalls,
    ...(scripts ? { redis_scripts: scripts } : {}),
    redis_cpu_us_per_event: Number(((redis1.cpuUs - redis0.cpuUs) / sent).toFixed(2)),
    redis_busy_fraction: Number(((redis1.cpuUs - redis0.cpuUs) / 1e6 / backlogSeconds).toFixed(3)),
    redis_memory_bytes_per_window_record: windowRecords ? Math.round(mem / windowRecords) : null,
    redis_state_bytes_per_window_record: windowRecords ? Math.round(state.total / windowRecords) : null,
    redis_state_bytes_per_window_record_by_family: Object.fromEntries(
      Object.entries(state.byFamily).map(([f, bytes]) => [f, Math.round(bytes / (windowRecords || 1))]),
    ),
    redis_memory_definitions: {
      memory:
        'used_memory after the run − before the service started: the state plus what Redis keeps that no key holds (script cache, slow-log entries of long script calls, first-use allocations; about 0.65 MB in a focused run, given back by no DEL)',
      state: "MEMORY USAGE (SAMPLES 0) summed over the run's keys, by key family",
    },
    window_records: windowRecords,
    at_lookback_2000: {
      window_records: bigRecords,
      redis_memory_bytes_per_window_record: bigRecords ? Math.round(bigMem / bigRecords) : null,
      redis_state_bytes_per_window_record: bigRecords ? Math.round(bigState.total / bigRecords) : null,
      definition:
        'the same backlog (and the paced traffic) read again by a detector with DETECTOR_LOOKBACK=2000 (10× the default) under a fresh prefix; same two measures',
    },
    targets: { ratio_min: 0.5, round_trips_per_event_max: 0.05 },
  });
}

/** Window records of the bench's four agents under `prefix`, over every window bucket. */
async function windowRecordsOf(b: Bench, prefix: string): Promise<number> {
  const cards = await Promise.all(
    [0, 1, 2, 3].flatMap((a) =>
      Array.from({ length: 41 }, (_, i) => (i === 0 ? '' : `:${i - 1}`)).map((bucket) =>
        b.redis.zcard(`${prefix}:det:{default|agent-${a}}:window${bucket}`),
      ),
    ),
  );
  return cards.reduce((x, y) => x + y, 0);
}

/**
 * Redis's script time and calls (INFO commandstats: EVALSHA and EVAL, µs) and its process CPU (INFO cpu, µs)
 * so far; with BENCH_SLOWLOG set, every command is logged from the first call on (SLOWLOG GET then gives each
 * script's calls and time: see scriptsByTime).
 */
async function redisTime(b: Bench, first = false) {
  if (first && process.env.BENCH_SLOWLOG) {
    await b.redis.config('SET', 'slowlog-log-slower-than', '0', 'slowlog-max-len', '100000');
    await b.redis.slowlog('RESET');
  }
  const stats = await b.redis.info('commandstats');
  let scriptUs = 0;
  let scriptCalls = 0;
  for (const m of stats.matchAll(/^cmdstat_(?:evalsha|eval):calls=(\d+),usec=(\d+)/gm)) {
    scriptCalls += Number(m[1]);
    scriptUs += Number(m[2]);
  }
  const cpu = await b.redis.info('cpu');
  const secs = (f: string) => Number(new RegExp(`^${f}:([\\d.]+)`, 'm').exec(cpu)?.[1] ?? 0);
  return { scriptUs, scriptCalls, cpuUs: (secs('used_cpu_user') + secs('used_cpu_sys')) * 1e6 };
}

/** Per script (SHA1 prefix and key count, which names it: apply = 11 keys), calls and µs per call, from SLOWLOG. */
async function scriptsByTime(b: Bench) {
  if (!process.env.BENCH_SLOWLOG) return undefined;
  const log = (await b.redis.slowlog('GET', 100000)) as [number, number, number, string[]][];
  const by: Record<string, { calls: number; us: number }> = {};
  for (const [, , us, args] of log) {
    if (String(args[0]).toLowerCase() !== 'evalsha') continue;
    const k = `${String(args[1]).slice(0, 8)}/${args[2]}`;
    by[k] ??= { calls: 0, us: 0 };
    by[k].calls++;
    by[k].us += us;
  }
  await b.redis.config('SET', 'slowlog-log-slower-than', '10000');
  return Object.fromEntries(
    Object.entries(by).map(([k, v]) => [k, { calls: v.calls, us_per_call: Math.round(v.us / v.calls) }]),
  );
}

/** The detector's keys (MEMORY USAGE, every element sampled), summed by family: `done:<p>:<b>` → `done`. */
async function stateBytes(b: Bench, id: string) {
  const byFamily: Record<string, number> = {};
  let total = 0;
  let cursor = '0';
  do {
    const [next, keys] = await b.redis.scan(cursor, 'MATCH', `${id}:det:*`, 'COUNT', 1000);
    cursor = next;
    for (const key of keys) {
      const bytes = Number(await b.redis.call('MEMORY', 'USAGE', key, 'SAMPLES', '0'));
      const family = key
        .slice(`${id}:det:`.length)
        .replace(/^\{[^}]*\}:/, '')
        .split(':')[0]!;
      byFamily[family] = (byFamily[family] ?? 0) + bytes;
      total += bytes;
    }
  } while (cursor !== '0');
  return { total, byFamily };
}
