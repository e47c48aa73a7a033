/**
 * Where the detector's Redis script time goes: the bench's event stream applied straight to a private
 * redis-server through the detector's store (no Kafka, no service), in batches as the service makes them, with
 * Redis's own accounting of the apply script's time (INFO commandstats) per event. Variants: the whole stream;
 * tool calls only (no task completes: the open-task bookkeeping alone); the shortest sequences only (less
 * counting); a window that never evicts; a one-second memory of completed task ids; a full window evicting at
 * lookback 200, 10,000 and 100,000 (script time per eviction). Not part of `npm run bench`:
 *
 *   npm run build && node dist/bench/detector-redis.js      # BENCH_EVENTS (default 100,000), BENCH_BATCH (1,200)
 */
import { Redis } from 'ioredis';
import { startRedis } from '../deploy/local/stack.js';
import { murmur2, toPositive } from '../shared/kafka/partitioner.js';
import { RedisDetectorStore } from '../services/detector/src/adapters/redis/store.js';
import { toOp, type DetectorOp } from '../services/detector/src/core/ops.js';
import { DEFAULT_PARAMS, type DetectorParams } from '../services/detector/src/core/params.js';
import { toolCallsEventV1 } from '../schemas/tool-calls.v1.js';
import { agentEvents } from '../testkit/streams.js';

const N = Number(process.env.BENCH_EVENTS ?? 100_000);
const BATCH = Number(process.env.BENCH_BATCH ?? 1_200);

const events = [];
for (const e of agentEvents({ tasks: Math.ceil(N / 4), seed: 1, agents: 4 })) {
  events.push(e);
  if (events.length >= N) break;
}
// Three partitions, each session's events on the one the tool-calls topic keyed by session_id gives it.
const partitionOf = (session: string) => toPositive(murmur2(session)) % 3;
const all = events
  .map((e, i) => toOp(toolCallsEventV1.parse(e), true, partitionOf(e.session_id), String(i)))
  .filter((o): o is DetectorOp => o !== null);

const server = await startRedis();
const redis = new Redis(server.url);
try {
  const run = async (variant: string, ops: DetectorOp[], params: DetectorParams = DEFAULT_PARAMS) => {
    await redis.flushall();
    await redis.config('RESETSTAT');
    const store = new RedisDetectorStore(redis, params, 'bench', 30_000);
    for (let i = 0; i < ops.length; i += BATCH) await store.applyBatch(ops.slice(i, i + BATCH));
    const stats = await redis.info('commandstats');
    const usec = Number(/cmdstat_evalsha:calls=\d+,usec=(\d+)/.exec(stats)?.[1] ?? NaN);
    const row = {
      variant,
      ops: ops.length,
      completions: ops.filter((o) => o.kind === 'done').length,
      script_us_per_op: Number((usec / ops.length).toFixed(2)),
    };
    process.stdout.write(`${JSON.stringify(row)}\n`);
  };
  await run('whole stream', all);
  await run(
    'tool calls only',
    all.filter((o) => o.kind === 'call'),
  );
  await run('sequences of 3 only', all, { ...DEFAULT_PARAMS, maxLength: DEFAULT_PARAMS.minLength });
  await run('no eviction (lookback 20,000)', all, { ...DEFAULT_PARAMS, lookback: 20_000 });
  await run('ids remembered 1 s', all, { ...DEFAULT_PARAMS, doneRetentionMs: 1_000 });
  // A full window evicting one record per completion, at growing lookback: the cost per eviction must not grow
  // with the bucket count (one per 100 records). Filled first; only the evicting batches are counted.
  for (const lookback of [200, 10_000, 100_000]) {
    await redis.flushall();
    const params = {
      ...DEFAULT_PARAMS,
      lookback,
      minLength: 1,
      maxLength: 1,
      taskIdleMs: 1_000,
      doneRetentionMs: 1_000,
    };
    const store = new RedisDetectorStore(redis, params, 'bench', 30_000);
    const scope = { tenant: 't', agent: 'a' };
    const batchOf = (b: number): DetectorOp[] =>
      Array.from({ length: 200 }, (_, k) => {
        const task = `b${b}-${k}`;
        const ts = 1_000_000 + (b * 200 + k) * 100;
        return [
          {
            kind: 'call',
            scope,
            task,
            eventId: `${task}-0`,
            ts,
            step: 0,
            tool: 'x',
            cost: 10_000,
            partition: 0,
            offset: '0',
          },
          { kind: 'done', scope, task, eventId: `${task}-d`, ts: ts + 10, partition: 0, offset: '0' },
        ] satisfies DetectorOp[];
      }).flat();
    const fill = Math.ceil(lookback / 200) + 1;
    for (let b = 0; b < fill; b++) await store.applyBatch(batchOf(b));
    await redis.config('RESETSTAT');
    for (let b = fill; b < fill + 20; b++) await store.applyBatch(batchOf(b));
    const stats = await redis.info('commandstats');
    const usec = Number(/cmdstat_evalsha:calls=\d+,usec=(\d+)/.exec(stats)?.[1] ?? NaN);
    const row = {
      variant: `evicting, lookback ${lookback}`,
      evictions: 20 * 200,
      script_us_per_eviction: Number((usec / 4_000).toFixed(2)),
    };
    process.stdout.write(`${JSON.stringify(row)}\n`);
  }
} finally {
  redis.disconnect();
  await server.stop();
}
