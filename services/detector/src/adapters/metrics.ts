import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';
import { IGNORE_REASONS } from '../core/state.js';
import type { RedisDetectorStore } from './redis/store.js';

/** The detector's own metrics (the runner's and HTTP's are shared); `store`'s round trips among them. */
export function createDetectorMetrics(registry: Registry, store: Pick<RedisDetectorStore, 'roundTrips'>) {
  const registers = [registry];
  const events = new Counter({
    name: 'paver_detector_events_total',
    help: 'Detector events by outcome (applied, ignored: see paver_detector_events_ignored_total).',
    labelNames: ['outcome'],
    registers,
  });
  const ignoredBy = new Counter({
    name: 'paver_detector_events_ignored_total',
    help: 'Events the detector did not use, by reason: duplicate (redelivered), late (for a closed task, or older than the task idle limit behind its partition), task_limit, misrouted (its task open on another partition: the topic must be keyed by session_id), future (ts further than DETECTOR_MAX_AHEAD_MS after its Kafka record).',
    labelNames: ['reason'],
    registers,
  });
  for (const reason of [...IGNORE_REASONS, 'future']) ignoredBy.inc({ reason }, 0);
  const records = new Counter({
    name: 'paver_detector_records_completed_total',
    help: 'Task records completed and entered into the window.',
    registers,
  });
  const published = new Counter({
    name: 'paver_detector_candidates_published_total',
    help: 'Candidate records published, by status.',
    labelNames: ['status'],
    registers,
  });
  const recovered = new Counter({
    name: 'paver_detector_recovered_publications_total',
    help: 'Publications of changes an instance applied and never published (it died first), by how they were found: batch (a later batch of the scope), retry (the lock its holder left ran out), sweep (the periodic check of every scope).',
    labelNames: ['via'],
    registers,
  });
  const retired = new Counter({
    name: 'paver_detector_scopes_retired_total',
    help: 'Scopes the sweep found idle for DETECTOR_SCOPE_TTL_MS, by outcome: retired (candidates retracted, state deleted), revived (an event came in meanwhile: kept and published again).',
    labelNames: ['outcome'],
    registers,
  });
  let tripsSeen = 0;
  const trips = new Counter({
    name: 'paver_detector_redis_round_trips_total',
    help: 'Redis round trips made by the detector, answered or failed: batches, rebuilds, publications and their retries, the sweep (each SCAN page of its one look for registries without an index too).',
    registers,
    // The store's tally, taken whenever the registry is read: every round trip made by then is in it, whatever
    // made it (a batch that failed, a rebuild, the sweep, a publication retry). Taken at the end of each good
    // batch instead, the others waited for the next good batch, and those after the last one were never seen.
    collect() {
      const n = store.roundTrips;
      this.inc(n - tripsSeen);
      tripsSeen = n;
    },
  });
  const rebuilds = new Counter({
    name: 'paver_detector_rebuilds_total',
    help: 'Partition state rebuilds from Kafka (the Redis state was lost, or the partition was never built under the current epoch), by outcome: rebuilt, retried (lost again meanwhile), stopped (the consumer stopped or lost the partition: its next owner rebuilds it), failed.',
    labelNames: ['outcome'],
    registers,
  });
  for (const outcome of ['rebuilt', 'retried', 'stopped', 'failed']) rebuilds.inc({ outcome }, 0);
  const rebuilding = new Gauge({
    name: 'paver_detector_rebuilding',
    help: 'Partitions whose state is being rebuilt from Kafka now (/readyz is false meanwhile).',
    registers,
  });
  const replayed = new Counter({
    name: 'paver_detector_rebuild_events_total',
    help: 'Input messages replayed from Kafka by rebuilds.',
    registers,
  });
  return { events, ignoredBy, records, published, recovered, retired, trips, rebuilds, rebuilding, replayed };
}
export type DetectorMetrics = ReturnType<typeof createDetectorMetrics>;
