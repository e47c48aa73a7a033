/**
 * Where the detector's Redis script time goes: the bench's event stream applied straight to a private
 * redis-server through the detector's store (no Kafka, no service), in batches as the service makes them, with
 * Redis's own accounting of the apply script's time (INFO commandstats) per event. Variants: the whole stream;
 * tool calls only (no task completes: the open-task bookkeeping alone); the shortest sequences only (less
 * counting); a window that never evicts; a one-second memory of completed task ids. Not part of `npm run bench`:
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
} finally {
  redis.disconnect();
  await server.stop();
}
