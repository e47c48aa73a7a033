import { Counter, Gauge, Histogram } from 'prom-client';
import type { Registry } from 'prom-client';

/**
 * Active rules per scope, each as of its last write by this instance, or as read from Redis when the instance
 * started (or restored the rules after a loss). A scope no batch has written for the scope TTL has expired in
 * Redis, rules and all: its count stops counting (and is dropped) then, not at restart.
 */
export class ActiveRulesByScope {
  private readonly counts = new Map<string, { n: number; at: number }>();
  /** Reads of the counts from Redis under way: what batches wrote (or a loss cleared) since each began. */
  private readonly seeds = new Set<{ written: Set<string>; stale: boolean }>();
  constructor(
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get size(): number {
    return this.counts.size;
  }

  set(scope: string, n: number): void {
    this.counts.set(scope, { n, at: this.now() });
    for (const r of this.seeds) r.written.add(scope);
  }

  delete(scope: string): void {
    this.counts.delete(scope);
    for (const r of this.seeds) r.written.add(scope);
  }

  clear(): void {
    this.counts.clear();
    for (const r of this.seeds) r.stale = true;
  }

  /**
   * Counts read from Redis (at start, after a restore: scopes no batch of this process has written yet). A count
   * never replaces what a batch wrote since the read began, nor comes back after a loss cleared the gauge.
   * `at`: when the scope was last written, so that it stops counting when its rules expire.
   */
  seed(): { set(scope: string, n: number, at: number): void; end(): void } {
    const run = { written: new Set<string>(), stale: false };
    this.seeds.add(run);
    return {
      set: (scope, n, at) => {
        if (!run.stale && !run.written.has(scope) && n > 0) this.counts.set(scope, { n, at });
      },
      end: () => void this.seeds.delete(run),
    };
  }

  total(): number {
    const now = this.now();
    let n = 0;
    for (const [scope, c] of this.counts) {
      if (this.ttlMs > 0 && now - c.at >= this.ttlMs) this.counts.delete(scope);
      else n += c.n;
    }
    return n;
  }
}

/** Auto-seq's own metrics (the runner's and HTTP's are shared). `scopeTtlMs`: AUTOSEQ_LEARN_SCOPE_TTL_MS. */
export function createAutoseqMetrics(
  registry: Registry,
  catalogTools: () => number,
  scopeTtlMs = 0,
  now: () => number = Date.now,
) {
  const registers = [registry];
  const decisions = new Counter({
    name: 'paver_autoseq_decisions_total',
    help: 'Auto-seq records published, by event type and skip reason.',
    labelNames: ['event_type', 'reason'],
    registers,
  });
  const saved = new Counter({
    name: 'paver_autoseq_llm_steps_saved_total',
    help: 'LLM steps saved: calls executed from a unique decision, or equal (tool and arguments) to an active proposal.',
    registers,
  });
  const proposals = new Counter({
    name: 'paver_autoseq_proposals_total',
    help: 'Proposals held for a next call and scored when it came (or the task ended), by origin, state and outcome.',
    labelNames: ['origin', 'state', 'outcome'],
    registers,
  });
  const transitions = new Counter({
    name: 'paver_autoseq_rule_transitions_total',
    help: 'Learned rule state changes, by target state.',
    labelNames: ['to'],
    registers,
  });
  // Per scope, so a scope seen again replaces its count instead of adding to it.
  const activeByScope = new ActiveRulesByScope(scopeTtlMs, now);
  new Gauge({
    name: 'paver_autoseq_active_rules',
    help: "Active learned rules of every scope of the key prefix, as this instance last wrote or read each (at start, after a restore): one instance's view of the whole, so aggregate instances with max, never sum.",
    registers,
    collect() {
      this.set(activeByScope.total());
    },
  });
  const duplicates = new Counter({
    name: 'paver_autoseq_redelivered_events_total',
    help: 'Tool-call events already decided (redelivery), ignored.',
    registers,
  });
  const decisionSeconds = new Histogram({
    name: 'paver_autoseq_decision_seconds',
    help: 'In-process decision time per tool-call event.',
    buckets: [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01],
    registers,
  });
  const catalogUpdates = new Counter({
    name: 'paver_autoseq_catalog_updates_total',
    help: 'Tool-catalog topic records, by outcome (rejected ones are dead-lettered).',
    labelNames: ['outcome'],
    registers,
  });
  new Gauge({
    name: 'paver_autoseq_catalog_tools',
    help: 'Tools in the catalog in force.',
    registers,
    collect() {
      this.set(catalogTools());
    },
  });
  const stateLosses = new Counter({
    name: 'paver_autoseq_state_losses_total',
    help: 'Times the Redis state (learned rules, task states) was found lost (epoch marker gone); the rules are restored from the rules topic.',
    registers,
  });
  const snapshotRecords = new Counter({
    name: 'paver_autoseq_rules_snapshot_records_total',
    help: "Records written to the rules topic, by kind: context, tombstone (evicted), too_large (left out: over PAVER_MAX_OUTPUT_BYTES as the broker counts it; a context's record is tombstoned, a scope whose record cannot fit is left out of the copy), trimmed (a scope record sent without its families' evidence to fit), forget_marker (a forget's marker: no restore brings back a copy read before it).",
    labelNames: ['kind'],
    registers,
  });
  const snapshotPending = new Gauge({
    name: 'paver_autoseq_rules_snapshot_pending',
    help: 'Learned contexts changed in Redis and not yet copied to the rules topic.',
    registers,
  });
  const snapshotFlushes = new Counter({
    name: 'paver_autoseq_rules_snapshot_flushes_total',
    help: 'Copies of the changed contexts to the rules topic, by outcome (ok, failed: kept for the next one).',
    labelNames: ['outcome'],
    registers,
  });
  const restoredContexts = new Counter({
    name: 'paver_autoseq_rules_restored_contexts_total',
    help: 'Learned contexts written back to Redis from the rules topic after a Redis loss.',
    registers,
  });
  const scopesRetired = new Counter({
    name: 'paver_autoseq_scopes_retired_total',
    help: 'Idle scopes taken out of Redis and the rules topic, by outcome: retired (state deleted, records tombstoned), gone (taken out of the registry found without state: Redis expired it before a sweep), stale_copy (a late copy of a scope retired or forgotten before, tombstoned by the sweep after its own fence failed to send), expired_at_restore (left out by a restore as expired, its records queued for the sweep), forgotten_at_restore (left out by a restore: its copy was read before a forget of the scope).',
    labelNames: ['outcome'],
    registers,
  });
  const leaseWaits = new Counter({
    name: 'paver_autoseq_scope_lease_waits_total',
    help: 'Batches that waited for a scope another batch (another instance, or partition) was learning in.',
    registers,
  });
  return {
    leaseWaits,
    stateLosses,
    snapshot: { records: snapshotRecords, pending: snapshotPending, flushes: snapshotFlushes },
    restoredContexts,
    scopesRetired,
    decisions,
    saved,
    proposals,
    transitions,
    activeByScope,
    duplicates,
    decisionSeconds,
    catalogUpdates,
  };
}
export type AutoseqMetrics = ReturnType<typeof createAutoseqMetrics>;
