import { rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { rng } from '../testkit/streams.js';
import {
  bareRate,
  benchConfig,
  createTopics,
  pipeRate,
  ratios,
  underLoad,
  histogramQuantileMs,
  produceBacklog,
  redisInfo,
  say,
  serviceRate,
  startService,
  writeResult,
  quantiles,
  type Bench,
} from './harness.js';

const HTTP_METRIC = 'paver_http_request_duration_seconds';
const ROUTE = '/sessions/:session_id/allowed-tools';
const TOOLS = [
  'web_search',
  'think',
  'reflect',
  'summarize',
  'save',
  'critique',
  'debate',
  'search',
  'http_get',
  'email',
];
const CONFIG = {
  tools: TOOLS,
  steps: [
    {
      name: 'research',
      conditions: [{ type: 'message_regex', value: 'research|look up' }],
      availableTools: { allowed: ['web_search', 'think', 'reflect', 'summarize', 'save'] },
      sequence: ['web_search', ['think', 'reflect'], ['summarize', 'save']],
    },
    {
      name: 'evaluate',
      conditions: [{ type: 'message_regex', value: 'critique|evaluate|assess' }],
      availableTools: { allowed: ['critique', 'debate', 'reflect', 'search'] },
      sequence: ['critique', 'debate', 'reflect'],
    },
    { name: 'general', isDefault: true, availableTools: { denied: ['save'] } },
  ],
};

/** `sessions` concurrent sessions, each: a user message, then tool calls that mostly follow the sequence. */
function* events(sessions: number, total: number) {
  const r = rng(11);
  const perSession = Math.ceil(total / sessions);
  let ts = 1_760_000_000_000;
  for (let k = 0; k < perSession; k++) {
    for (let s = 0; s < sessions; s++) {
      const base = { event_id: `s${s}-${k}`, ts: ts++, session_id: `sess-${s}` };
      if (k === 0)
        yield {
          ...base,
          type: 'user_message',
          text: r() < 0.5 ? 'please research the market' : 'evaluate this draft',
        };
      else
        yield {
          ...base,
          type: 'tool_call',
          task_id: `t${s}`,
          step: k,
          tool: TOOLS[Math.floor(r() * TOOLS.length)]!,
        };
    }
  }
}

export async function benchSequencer(b: Bench, n: number, sessions: number) {
  const id = `bench-seq-${Date.now().toString(36)}`;
  const topic = `${id}.tool-calls`;
  await createTopics(b, [
    { topic },
    { topic: `${id}.sequence-state` },
    { topic: `${id}.dead-letters` },
    { topic: `${id}.pipe-out` },
    { topic: `${id}.orchestration`, compacted: true },
  ]);
  const sent = await produceBacklog(b, topic, events(sessions, n), n);
  const bare = await underLoad(() => bareRate(b, topic, sent));
  const pipe = await underLoad(() => pipeRate(b, topic, `${id}.pipe-out`, sent));
  const config = join(tmpdir(), `${id}-orchestration.json`);
  writeFileSync(config, JSON.stringify(CONFIG));
  const mem0 = await redisInfo(b.redis, 'memory', 'used_memory');
  const p = await startService(b, 'sequencer', {
    REDIS_KEY_PREFIX: id,
    PAVER_TOPIC_TOOL_CALLS: topic,
    PAVER_TOPIC_SEQUENCE_STATE: `${id}.sequence-state`,
    PAVER_TOPIC_DEAD_LETTERS: `${id}.dead-letters`,
    PAVER_TOPIC_ORCHESTRATION: `${id}.orchestration`,
    SEQUENCER_GROUP_ID: `${id}-sequencer`,
    SEQUENCER_CONFIG_FILE: config,
    // Every session stays cached through the run, so the first figure is the common case (a session this
    // instance wrote recently) whatever the machine's speed; the second is the Redis path (never written here).
    SEQUENCER_STATE_CACHE_SIZE: String(sessions),
    SEQUENCER_STATE_CACHE_MAX_AGE_MS: '3600000',
  });
  const run = await underLoad(() => serviceRate(p, sent));
  const rate = run.result.events_per_s;
  const stored = (await b.redis.dbsize()) && (await countKeys(b, `${id}:seq:*`));
  const mem = (await redisInfo(b.redis, 'memory', 'used_memory')) - mem0;
  say(`sequencer: ${rate} events/s, ${run.result.cpu_us_per_event} µs CPU/event, ${stored} sessions stored`);

  // allowed-tools over HTTP on loopback, one request at a time (the latency a runtime sees before an LLM call),
  // measured with two clients: fetch (undici), as before, and a lean keep-alive client on one socket. fetch
  // allocates ~47 KB per request in this process, whose scavenges then land inside measured requests: the lean
  // client keeps the measuring process's own GC out of the service's figure.
  const path = (s: number) => `/sessions/sess-${s}/allowed-tools?tools=${TOOLS.join(',')}`;
  const lean = await leanClient(p.port);
  for (let i = 0; i < 200; i++) {
    await (await fetch(`http://127.0.0.1:${p.port}${path(i)}`)).text(); // warm-up
    await lean.get(path(i));
  }
  async function latencies(client: 'fetch' | 'lean', pick: () => number) {
    const lat: number[] = [];
    for (let i = 0; i < 5000; i++) {
      const t = performance.now();
      if (client === 'lean') {
        const res = await lean.get(path(pick()));
        if (res.status !== 200) throw new Error(`allowed-tools answered ${res.status}: ${res.body}`);
      } else {
        const res = await fetch(`http://127.0.0.1:${p.port}${path(pick())}`);
        await res.text();
      }
      lat.push(performance.now() - t);
    }
    return lat;
  }
  const r = rng(5);
  const hit = () => Math.floor(r() * sessions);
  const never = () => sessions + Math.floor(r() * sessions);
  // The service's own view of the same requests: its latency histogram, differenced around each phase.
  const routeBuckets = async () => {
    const text = await (await fetch(`http://127.0.0.1:${p.port}/metrics`)).text();
    const buckets = new Map<string, number>();
    for (const line of text.split('\n')) {
      if (!line.startsWith(`${HTTP_METRIC}_bucket{`) || !line.includes(`route="${ROUTE}"`)) continue;
      const le = /le="([^"]+)"/.exec(line)![1]!;
      buckets.set(le, (buckets.get(le) ?? 0) + Number(line.split(' ').pop()));
    }
    return buckets;
  };
  async function phase(client: 'fetch' | 'lean', pick: () => number) {
    const before = await routeBuckets();
    const lat = await latencies(client, pick);
    const after = await routeBuckets();
    const text = [...after]
      .map(([le, n]) => `${HTTP_METRIC}_bucket{le="${le}"} ${n - (before.get(le) ?? 0)}`)
      .join('\n');
    return {
      lat,
      server: {
        p50: histogramQuantileMs(text, HTTP_METRIC, 0.5),
        p99: histogramQuantileMs(text, HTTP_METRIC, 0.99),
      },
    };
  }
  const http = await underLoad(async () => ({
    hitFetch: await phase('fetch', hit),
    hitLean: await phase('lean', hit),
    // Every read, the cached ones included, waits for one Redis GET (the epoch check): that round trip alone,
    // from this process in the same conditions, is the floor under the figures around it.
    redisGet: await redisGetLatencies(b, 5000),
    missFetch: await phase('fetch', never),
    missLean: await phase('lean', never),
  }));
  const { hitFetch, hitLean, missFetch, missLean, redisGet } = http.result;
  const [lat, leanLat, miss, leanMiss] = [hitFetch.lat, hitLean.lat, missFetch.lat, missLean.lat];
  lean.close();
  const metricsText = await (await fetch(`http://127.0.0.1:${p.port}/metrics`)).text();
  const reads = (source: string) =>
    metricsText
      .split('\n')
      .filter((l) => l.startsWith('paver_sequencer_state_reads_total{') && l.includes(`source="${source}"`))
      .reduce((a, l) => a + Number(l.split(' ').pop()), 0);
  const readsBySource = { cache: reads('cache'), redis: reads('redis') };
  await p.stop();
  // The service read it at start: left behind, every run added one to the temp folder.
  rmSync(config, { force: true });
  writeResult('sequencer', {
    events: sent,
    sessions,
    bare_kafkajs_events_per_s: bare.result.events_per_s,
    sequencer_events_per_s: rate,
    ratio_sequencer_to_bare: Number((rate / bare.result.events_per_s).toFixed(3)),
    ratio_sequencer_to_pipe: Number((rate / pipe.result.events_per_s).toFixed(3)),
    throughput: ratios(run.result, bare.result, pipe.result),
    load: { bare: bare.load, pipe: pipe.load, service: run.load, allowed_tools_http: http.load },
    config: benchConfig(),
    allowed_tools_http_ms: {
      ...quantiles(lat),
      requests: lat.length,
      definition:
        'GET /sessions/{id}/allowed-tools on loopback, sequential, client-measured with fetch; sessions this instance wrote',
    },
    allowed_tools_http_lean_client_ms: {
      ...quantiles(leanLat),
      requests: leanLat.length,
      definition:
        'the same measured with a lean keep-alive HTTP/1.1 client on one socket (the measuring process allocates little, so its GC stays out of the figure)',
    },
    allowed_tools_http_redis_path_ms: {
      ...quantiles(miss),
      requests: miss.length,
      definition: 'fetch, for sessions this instance never wrote (one Redis round trip each)',
    },
    allowed_tools_http_redis_path_lean_client_ms: {
      ...quantiles(leanMiss),
      requests: leanMiss.length,
      definition: 'the lean client, for sessions this instance never wrote',
    },
    redis_get_round_trip_ms: {
      ...quantiles(redisGet),
      requests: redisGet.length,
      definition:
        'one GET on a raw RESP socket from the bench process to the same Redis, one at a time, between the cached and Redis-path phases: the round trip a Redis-path read includes, and the epoch check of every read when client-side tracking is off (SEQUENCER_EPOCH_HEARTBEAT_MS=0)',
    },
    allowed_tools_server_side_ms: {
      cache_path: { fetch: hitFetch.server, lean_client: hitLean.server },
      redis_path: { fetch: missFetch.server, lean_client: missLean.server },
      definition: `the service's own ${HTTP_METRIC} for the same requests (request received to response finished), interpolated within its buckets (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 5 ms …)`,
    },
    allowed_tools_reads_by_source: readsBySource,
    redis_bytes_per_session: stored ? Math.round(mem / stored) : null,
    targets: { ratio_min: 0.6, allowed_tools_p99_ms_max: 1, redis_bytes_per_session_max: 300 },
  });
}

/**
 * A keep-alive HTTP/1.1 GET client on one socket, one request at a time: what the service answers, with as little
 * of the client's own work (and garbage) as possible in the measured time. Responses carry content-length. The
 * server closes a connection idle for its keep-alive timeout: the next request then opens another (as fetch does).
 */
async function leanClient(port: number) {
  let sock: Socket | null = null;
  let waiting: { resolve: (r: { status: number; body: string }) => void; reject: (e: Error) => void } | null =
    null;
  let buf: Buffer | null = null;
  const open = () =>
    new Promise<Socket>((resolve, reject) => {
      const s = connect(port, '127.0.0.1');
      s.setNoDelay(true);
      s.once('connect', () => resolve(s));
      s.once('error', reject);
      s.on('data', (chunk: Buffer) => {
        buf = buf ? Buffer.concat([buf, chunk]) : chunk;
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buf.toString('latin1', 0, end);
        const len = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        const res = { status: Number(head.slice(9, 12)), body: buf.toString('utf8', end + 4, end + 4 + len) };
        buf = buf.length > end + 4 + len ? buf.subarray(end + 4 + len) : null;
        const w = waiting;
        waiting = null;
        w?.resolve(res);
      });
      s.on('error', (err) => waiting?.reject(err));
      s.on('close', () => {
        if (sock === s) sock = null;
        buf = null;
        waiting?.reject(new Error('connection closed before the response'));
      });
    });
  sock = await open();
  return {
    async get(path: string) {
      const s = (sock ??= await open());
      return new Promise<{ status: number; body: string }>((resolve, reject) => {
        waiting = { resolve, reject };
        s.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
      });
    },
    close: () => sock?.destroy(),
  };
}

/** Sequential GETs of a missing key on a raw RESP socket: the loopback round trip to Redis, with no client library. */
async function redisGetLatencies(b: Bench, n: number): Promise<number[]> {
  const url = new URL(b.stack.redisUrl);
  const s = connect(Number(url.port), url.hostname);
  s.setNoDelay(true);
  await new Promise<void>((resolve, reject) => {
    s.once('connect', resolve);
    s.once('error', reject);
  });
  let replied: () => void = () => undefined;
  s.on('data', () => replied());
  const lat: number[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await new Promise<void>((resolve) => {
        replied = resolve;
        s.write('*2\r\n$3\r\nGET\r\n$18\r\npaver-bench:absent\r\n');
      });
      lat.push(performance.now() - t);
    }
  } finally {
    s.destroy();
  }
  return lat;
}

async function countKeys(b: Bench, pattern: string) {
  let cursor = '0';
  let n = 0;
  do {
    const [next, keys] = await b.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 10_000);
    cursor = next;
    n += keys.length;
  } while (cursor !== '0');
  return n;
}
