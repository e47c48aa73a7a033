import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';

/**
 * The flows service's own metrics (the runner's and HTTP's are shared). `shadowPool` and `registered` are read at
 * each scrape: the engine's shadow pool and the registry's size as they are then.
 */
export function createFlowsMetrics(
  registry: Registry,
  gauges: { shadowPool: () => number; registered: () => number },
) {
  const registers = [registry];
  const selections = new Counter({
    name: 'paver_flows_selections_total',
    help: 'Flow selections, by path.',
    labelNames: ['path'],
    registers,
  });
  const modelCalls = new Counter({
    name: 'paver_flows_model_calls_total',
    help: 'Chat model calls, by outcome.',
    labelNames: ['outcome'],
    registers,
  });
  const decisions = new Counter({
    name: 'paver_flows_candidate_decisions_total',
    help: 'Candidate state changes, by status.',
    labelNames: ['status'],
    registers,
  });
  const unpromotable = new Counter({
    name: 'paver_flows_promotions_refused_total',
    help: 'Promotions refused because the flow would break the flows.v1 contract (the candidate stays pending).',
    registers,
  });
  const shadowTrials = new Counter({
    name: 'paver_flows_shadow_trials_total',
    help: 'Shadow choices of pending candidates scored against what the agent did.',
    registers,
  });
  const contention = new Counter({
    name: 'paver_flows_write_conflicts_total',
    help: 'Candidate writes that lost to another writer of the same candidate and were decided again.',
    registers,
  });
  const orphans = new Counter({
    name: 'paver_flows_orphans_withdrawn_total',
    help: 'Promoted flows found on the flows topic with a candidate decided otherwise, and withdrawn.',
    registers,
  });
  const manualWithdrawn = new Counter({
    name: 'paver_flows_manual_withdrawn_total',
    help: 'Hand-written flows withdrawn from the flows topic at a start because FLOWS_FILE no longer defines them.',
    registers,
  });
  const rebuilds = new Counter({
    name: 'paver_flows_state_rebuilds_total',
    help: 'Rebuilds of the Redis state from Kafka, by reason (start, lost) and outcome.',
    labelNames: ['reason', 'outcome'],
    registers,
  });
  new Gauge({
    name: 'paver_flows_shadow_pool',
    help: 'Pending candidates under shadow trial that this instance chooses among for each request.',
    registers,
    collect() {
      this.set(gauges.shadowPool());
    },
  });
  new Gauge({
    name: 'paver_flows_registered',
    help: 'Flows in the registry.',
    registers,
    collect() {
      this.set(gauges.registered());
    },
  });
  return {
    selections,
    modelCalls,
    decisions,
    unpromotable,
    shadowTrials,
    contention,
    orphans,
    manualWithdrawn,
    rebuilds,
  };
}
export type FlowsMetrics = ReturnType<typeof createFlowsMetrics>;
