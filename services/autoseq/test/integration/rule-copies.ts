import type { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import type { ReplayOptions } from '../../../../shared/kafka/replay.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { silentLogger, type Logger } from '../../../../shared/log.js';
import { testKafka, unique } from '../../../../test/helpers/kafka.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { RedisLearnStore, type ContextsWritten } from '../../src/adapters/redis/learn-store.js';
import { RuleSnapshots } from '../../src/adapters/rules-snapshot.js';
import { leaseKey } from '../../src/adapters/redis/scope-lease.js';
import type { ScopeRetirement } from '../../src/adapters/scope-retire.js';
import { applyEvent } from '../../src/core/learn/engine.js';
import type { LearnOptions } from '../../src/core/learn/learner.js';

/** Reading a rules topic from its start, as a restore does (a consumer group of its own on each call). */
export const rulesReplay = (topic: string): ReplayOptions => ({
  kafka: testKafka(),
  topic,
  groupPrefix: unique('g'),
  sessionTimeoutMs: 10_000,
  maxBytesPerPartition: 1024 * 1024,
});

/** One batch learned and saved as the service does, the scope's hash written with `scopeTtlMs` (0: none). */
export async function learnBatch(
  redis: Redis,
  prefix: string,
  batch: ToolCallsEvent[],
  opts: LearnOptions,
  scopeTtlMs: number,
): Promise<RedisLearnStore> {
  const store = await RedisLearnStore.load(
    redis,
    prefix,
    60_000,
    opts,
    batch,
    { ttlMs: 10_000 },
    undefined,
    undefined,
    scopeTtlMs,
  );
  for (const e of batch) applyEvent(store, e, opts);
  await store.save();
  return store;
}

/**
 * The rules-topic copier as the tests run it (never paused, generous limits), with the metrics it counts in;
 * `retirement`: the idle-scope sweep it registers scopes with (and queues scopes for), as the service wires it.
 */
export function ruleCopier(
  redis: Redis,
  prefix: string,
  sink: Sink,
  topic: string,
  retirement?: ScopeRetirement,
  /** PAVER_MAX_OUTPUT_BYTES as the service passes it. */
  maxRecordBytes = 1_000_000,
  log: Logger = silentLogger(),
  /** Wraps the fence the copy calls (`afterStaleCopy`): to see what it is given. */
  onRequeue?: (scopes: ContextsWritten[]) => void,
) {
  const metrics = createAutoseqMetrics(new Registry(), () => 0).snapshot;
  const snapshots = new RuleSnapshots({
    redis,
    prefix,
    sink,
    topic,
    maxRecordBytes,
    leaseMs: 10_000,
    log,
    paused: () => false,
    metrics,
    register: retirement && ((scopes) => retirement.register(scopes)),
    requeue:
      retirement &&
      ((scopes) => {
        onRequeue?.(scopes);
        return retirement.afterStaleCopy(scopes);
      }),
  });
  return { snapshots, metrics };
}

/**
 * A sink whose first send (a copy of `default`/`agent`) stalls past the copy's lease while `forgetter` forgets the
 * scope (POST /rules/forget takes the lease meanwhile), and whose second, the stale copy's fence, fails: the broker
 * down, this once. The others go through.
 */
export function stalledAcrossForget(
  redis: Redis,
  sink: Sink,
  prefix: string,
  forgetter: Pick<ScopeRetirement, 'forget'>,
  agent = 'f',
) {
  let sends = 0;
  const stalled: Sink = {
    ...sink,
    sendRaw: async (topic, records) => {
      sends++;
      if (sends === 1) {
        await redis.del(leaseKey(prefix, 'default', agent));
        await forgetter.forget('default', agent);
      }
      if (sends === 2) throw new Error('broker unavailable');
      await sink.sendRaw(topic, records);
    },
  };
  return { sink: stalled, sends: () => sends };
}
