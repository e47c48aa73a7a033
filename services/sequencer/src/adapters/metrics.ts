import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';
import { IGNORE_REASONS } from '../core/session.js';

/** The sequencer's own metrics (the runner's and HTTP's are shared). */
export function createSequencerMetrics(
  registry: Registry,
  agentsConfigured: () => number,
  cachedStates: () => number,
  epochTracked: () => boolean,
) {
  const registers = [registry];
  new Gauge({
    name: 'paver_sequencer_epoch_tracking',
    help: 'Whether the Redis-loss check costs allowed-tools reads no Redis command now (client-side tracking vouches for the epoch marker): 1 yes, 0 each read GETs the marker.',
    registers,
    collect() {
      this.set(epochTracked() ? 1 : 0);
    },
  });
  new Gauge({
    name: 'paver_sequencer_state_cache_entries',
    help: 'Session states this instance wrote, held for allowed-tools reads.',
    registers,
    collect() {
      this.set(cachedStates());
    },
  });
  new Gauge({
    name: 'paver_sequencer_agents_configured',
    help: 'Agents with an orchestration in force.',
    registers,
    collect() {
      this.set(agentsConfigured());
    },
  });
  const ignored = new Counter({
    name: 'paver_sequencer_events_ignored_total',
    help: 'Events left alone (no record published, no state written), by reason: tools_unknown (an agent with no orchestration and an event without visible_tools: no list of tools to allow all of).',
    labelNames: ['reason'],
    registers,
  });
  for (const reason of IGNORE_REASONS) ignored.inc({ reason }, 0);
  return {
    states: new Counter({
      name: 'paver_sequencer_states_published_total',
      help: 'Sequence-state records published.',
      registers,
    }),
    violations: new Counter({
      name: 'paver_sequencer_violations_total',
      help: 'Sequence violations, by policy.',
      labelNames: ['policy'],
      registers,
    }),
    duplicates: new Counter({
      name: 'paver_sequencer_redelivered_events_total',
      help: 'Events already applied (redelivery), ignored.',
      registers,
    }),
    ignored,
    stateReads: new Counter({
      name: 'paver_sequencer_state_reads_total',
      help: 'Allowed-tools reads of a session state, by source (cache: no session GET).',
      labelNames: ['source'],
      registers,
    }),
    stateLosses: new Counter({
      name: 'paver_sequencer_state_losses_total',
      help: 'Times the Redis session states were found lost (epoch marker gone); they are restored from the session topic.',
      registers,
    }),
    restored: new Counter({
      name: 'paver_sequencer_sessions_restored_total',
      help: 'Session states written back to Redis from the session topic after a Redis loss.',
      registers,
    }),
    updates: new Counter({
      name: 'paver_sequencer_config_updates_total',
      help: 'Orchestration topic records, by outcome (rejected ones are dead-lettered).',
      labelNames: ['outcome'],
      registers,
    }),
  };
}
export type SequencerMetrics = ReturnType<typeof createSequencerMetrics>;
