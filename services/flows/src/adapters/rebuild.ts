import type { RegisteredFlow } from '../../../../schemas/index.js';
import { PaverError } from '../../../../shared/errors.js';
import type { TableFeed } from '../../../../shared/kafka/table-feed.js';
import type { Logger } from '../../../../shared/log.js';
import { scopeTag } from '../../../../shared/redis/keys.js';
import { RebuildStopped, whileGoingOn, type RebuildReason } from '../../../../shared/redis/rebuild.js';
import type { OutcomeBook } from '../core/outcomes.js';
import type { FlowRegistry } from '../core/registry.js';
import type { RedisFlowStore } from './redis/store.js';
import type { CandidateStates } from './state-feed.js';

export interface RebuildDeps {
  store: Pick<RedisFlowStore, 'restore' | 'restoreRuns'>;
  /** This instance's outcome memory and its capacity (runs per scope). */
  outcomes: Pick<OutcomeBook, 'entries'>;
  outcomeCapacity: number;
  /** The state topic's feed and what it applied. */
  stateFeed: Pick<TableFeed, 'caughtUp'>;
  states: Pick<CandidateStates, 'entries'>;
  /** The flows topic's feed and the registry it fills. */
  feed: Pick<TableFeed, 'caughtUp'>;
  registry: Pick<FlowRegistry, 'all' | 'size'>;
  /** FLOWS_REGISTRY_WAIT_MS: how long each feed is waited for before the rebuild fails (and stays owed). */
  waitMs: number;
  log: Logger;
}

/**
 * Redis from Kafka: candidates' states from the state topic (HSETNX: a newer live write wins), promoted
 * flows from the registry (the flows topic), and the outcome memory this instance holds. The feeds must
 * have read their topics to the end first, or the copy would miss what was decided before the loss. A stop
 * (`goOn` false) ends the wait and the copy between scopes; the next start rebuilds again (it always does).
 * The outcome memory goes first and whole, stop or not: no topic holds it, so a rebuild given up before it
 * would lose it for good, while the next start restores the rest from the topics. It is bounded by what this
 * instance holds in memory (the scopes it loaded, `capacity` runs each).
 */
export function createRebuild(d: RebuildDeps) {
  return async (reason: RebuildReason, goOn: () => boolean): Promise<void> => {
    let runs = 0;
    for (const o of d.outcomes.entries()) {
      await d.store.restoreRuns(o.tenant, o.agent, o.runs, d.outcomeCapacity);
      runs += o.runs.length;
    }
    if (!(await whileGoingOn(goOn, d.stateFeed.caughtUp(d.waitMs))))
      throw new PaverError('KAFKA_UNAVAILABLE', 'flows state topic not read to its end yet');
    if (!(await whileGoingOn(goOn, d.feed.caughtUp(d.waitMs))))
      throw new PaverError('KAFKA_UNAVAILABLE', 'flows topic not read to its end yet');
    const flows = new Map<string, RegisteredFlow[]>();
    for (const f of d.registry.all()) {
      if (f.source !== 'promoted') continue;
      const k = scopeTag(f.tenant_id, f.agent_id);
      flows.set(k, [...(flows.get(k) ?? []), f]);
    }
    let candidates = 0;
    for (const s of d.states.entries()) {
      if (!goOn()) throw new RebuildStopped();
      await d.store.restore(s.tenant, s.agent, s.candidates, flows.get(scopeTag(s.tenant, s.agent)) ?? []);
      flows.delete(scopeTag(s.tenant, s.agent));
      candidates += s.candidates.length;
    }
    for (const fs of flows.values()) {
      if (!goOn()) throw new RebuildStopped();
      await d.store.restore(fs[0]!.tenant_id, fs[0]!.agent_id, [], fs);
    }
    d.log.info({ reason, candidates, flows: d.registry.size, runs }, 'flows state restored to redis');
  };
}
