import type { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { silentLogger } from '../../../../shared/log.js';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';
import { RuleSnapshots, type RuleSnapshotsSpec } from '../../src/adapters/rules-snapshot.js';

/**
 * The rules-topic copier as the tests run it (never paused, generous limits), with the metrics it counts in;
 * `register`: the idle-scope registry it writes, as the service wires it when scopes expire.
 */
export function ruleCopier(
  redis: Redis,
  prefix: string,
  sink: Sink,
  topic: string,
  register?: RuleSnapshotsSpec['register'],
) {
  const metrics = createAutoseqMetrics(new Registry(), () => 0).snapshot;
  const snapshots = new RuleSnapshots({
    redis,
    prefix,
    sink,
    topic,
    maxRecordBytes: 1_000_000,
    leaseMs: 10_000,
    log: silentLogger(),
    paused: () => false,
    metrics,
    register,
  });
  return { snapshots, metrics };
}
