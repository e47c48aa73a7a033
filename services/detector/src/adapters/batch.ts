import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { PaverError } from '../../../../shared/errors.js';
import type { BatchHandler } from '../../../../shared/kafka/runner.js';
import type { Logger } from '../../../../shared/log.js';
import { aheadOfRecord, scopeId, toOp, type DetectorOp, type Scope } from '../core/ops.js';
import { IGNORE_REASONS } from '../core/state.js';
import type { DetectorMetrics } from './metrics.js';
import type { ScopePublisher } from './publisher.js';
import type { Rebuilder } from './rebuild.js';
import type { RedisDetectorStore } from './redis/store.js';

export interface BatchDeps {
  store: Pick<RedisDetectorStore, 'applyBatch' | 'clearStale' | 'retireEpoch'>;
  rebuilder: Pick<Rebuilder, 'ensure' | 'invalidate' | 'exclusive' | 'noteApplied'>;
  publisher: Pick<ScopePublisher, 'publish'>;
  /** The partition's checkpoint after the batch (createCheckpointer). */
  checkpoint: (partition: number, next: bigint, epoch: string) => Promise<void>;
  requestTerms: boolean;
  /** DETECTOR_MAX_AHEAD_MS. */
  maxAheadMs: number;
  metrics: Pick<DetectorMetrics, 'events' | 'ignoredBy' | 'records'>;
  log: Logger;
}

/**
 * One chunk of one partition: its state made present (rebuilt if lost), the events applied in Redis, the scopes
 * they changed (and those a rebuild changed, or that owe an abandoned change) published, then the checkpoint.
 * The whole of it holds the partition against a rebuild of it by the Rebuilder's pass over owned partitions.
 */
export function createBatchHandler(d: BatchDeps): BatchHandler<ToolCallsEvent> {
  const { store, rebuilder, publisher, metrics: m, log } = d;
  const handle: BatchHandler<ToolCallsEvent> = async (batch, ctx) => {
    const first = batch[0];
    if (!first) return;
    const partition = first.partition;
    let future = 0;
    const ops: DetectorOp[] = [];
    for (const b of batch) {
      if (aheadOfRecord(b.value.ts, b.timestamp, d.maxAheadMs)) {
        future++;
        continue;
      }
      const op = toOp(b.value, d.requestTerms, b.partition, b.offset);
      if (op) ops.push(op);
    }
    if (future > 0) {
      m.events.inc({ outcome: 'ignored' }, future);
      m.ignoredBy.inc({ reason: 'future' }, future);
      log.warn(
        { future, partition, topic: first.topic, maxAheadMs: d.maxAheadMs },
        'events ignored: their ts is further than DETECTOR_MAX_AHEAD_MS after their Kafka record was produced (a clock running ahead, or ts not in milliseconds)',
      );
    }
    const touched = new Map(ops.map((o) => [scopeId(o.scope), o.scope]));
    const toPublish = new Map<string, Scope>();
    let out: Awaited<ReturnType<typeof store.applyBatch>>;
    let epoch: string;
    for (let attempt = 1; ; attempt++) {
      // Everything before this chunk on its partition has been applied (by this process or an earlier
      // owner): that is where a rebuild's replay ends.
      const ready = await rebuilder.ensure(partition, BigInt(first.offset), [...touched.values()], ctx);
      for (const s of ready.changed) toPublish.set(scopeId(s), s);
      epoch = ready.epoch;
      out = await store.applyBatch(ops, { epoch });
      if (!out.lost) break;
      if (attempt >= 5)
        throw new PaverError('REDIS_UNAVAILABLE', 'detector state lost in Redis again after every rebuild');
      if (!out.markerLost && !out.olderLayout && out.stale.length > 0) {
        // The partition was rebuilt in this epoch (ensure above), but these scopes were not: no rebuild had
        // an event of theirs to replay. Cleared as a rebuild would, then the batch is applied again.
        if (await store.clearStale(out.stale, epoch)) {
          log.warn(
            { partition, scopes: out.stale.length },
            'detector state of an earlier epoch that no rebuild reached (its events no longer on the tool-calls topic) cleared',
          );
          continue;
        }
      }
      if (out.olderLayout) {
        // Every scope's state holds every partition's part: all of them are rebuilt, under a new epoch.
        await store.retireEpoch(epoch);
        log.warn(
          { partition },
          'detector state of an older layout (written by an earlier version) found: a new Redis epoch rebuilds every partition from Kafka',
        );
      } else
        log.warn({ partition }, 'detector state lost in Redis during a batch: rebuilding before applying it');
      rebuilder.invalidate(partition);
    }
    rebuilder.noteApplied(partition, BigInt(batch[batch.length - 1]!.offset) + 1n);
    m.events.inc({ outcome: 'applied' }, out.applied);
    m.events.inc({ outcome: 'ignored' }, out.ignored);
    for (const reason of IGNORE_REASONS) m.ignoredBy.inc({ reason }, out.ignoredBy[reason]);
    // Never silent: late events are counted above and named here (counts only, never their contents).
    if (out.ignoredBy.late > 0)
      log.warn(
        { late: out.ignoredBy.late, partition: batch[0]?.partition, topic: batch[0]?.topic },
        'late events ignored (older than DETECTOR_TASK_IDLE_MS behind their partition, or after their task closed)',
      );
    if (out.ignoredBy.misrouted > 0)
      log.warn(
        { misrouted: out.ignoredBy.misrouted, partition: batch[0]?.partition, topic: batch[0]?.topic },
        'events of tasks open on another partition ignored (the tool-calls topic must be keyed by session_id)',
      );
    m.records.inc(out.completed);
    for (const s of out.changed) toPublish.set(scopeId(s), s);
    const owedOnly = out.owed.filter((s) => !toPublish.has(scopeId(s)));
    // Scopes publish independently (each under its own lock, to its own keys): their Redis and Kafka round
    // trips overlap instead of adding up. Every one has finished, written or failed, before the chunk counts
    // as handled; the first failure then fails it (and it is retried whole).
    const publications = await Promise.allSettled([
      ...[...toPublish.values()].map((scope) => publisher.publish(scope, true)),
      ...owedOnly.map((scope) => publisher.publish(scope, false)),
    ]);
    for (const p of publications) if (p.status === 'rejected') throw p.reason;
    await d.checkpoint(partition, BigInt(batch[batch.length - 1]!.offset) + 1n, epoch);
  };
  return async (batch, ctx) => {
    const first = batch[0];
    if (!first) return;
    return rebuilder.exclusive(first.partition, () => handle(batch, ctx), ctx);
  };
}
