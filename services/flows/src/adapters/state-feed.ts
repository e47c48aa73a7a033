import { z } from 'zod';
import { id } from '../../../../schemas/index.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { zodParser, type RuntimeDeps } from '../../../../shared/kafka/runner.js';
import { createTableFeed, type TableFeed, type TablePlace } from '../../../../shared/kafka/table-feed.js';
import type { StoredCandidate } from '../core/promotion.js';
import { scopeId } from '../core/registry.js';
import { storedCandidate } from './redis/store.js';

/**
 * The flows service's own compacted topic (`FLOWS_STATE_TOPIC`): the latest decision state of every candidate
 * (record, status, decision time, shadow record), keyed `tenant/agent/dedupe_key` (URI-encoded parts). Redis
 * holds the working copy; this topic is what survives Redis. It is internal to the service, so it is plain JSON
 * with this schema rather than a public contract (the codec reads plain JSON under every framing).
 */
export const candidateStateV1 = z.object({
  schema_version: z.literal(1),
  tenant_id: id,
  agent_id: id,
  candidate: storedCandidate,
});
export type CandidateState = z.infer<typeof candidateStateV1>;

export const candidateStateKey = (tenant: string, agent: string, key: string) =>
  [tenant, agent, key].map(encodeURIComponent).join('/');

/**
 * Every candidate's latest state, per scope, in memory: fed by the topic (all instances' writes) and by this
 * instance's own writes as soon as they are acknowledged (so a rebuild right after a write already has it).
 * Bounded by what the candidates hash in Redis holds: one entry per candidate the detector ever proposed.
 * The feed reads behind the writes, and gives back older records of a candidate after this instance's newer write
 * of it: the copy is whole only once the feed has read the topic to its end as it stands (`caughtUp`).
 */
export class CandidateStates {
  private readonly scopes = new Map<
    string,
    { tenant: string; agent: string; c: Map<string, StoredCandidate> }
  >();
  set(tenant: string, agent: string, c: StoredCandidate): void {
    const k = scopeId(tenant, agent);
    let s = this.scopes.get(k);
    if (!s) this.scopes.set(k, (s = { tenant, agent, c: new Map() }));
    s.c.set(c.record.dedupe_key, c);
  }
  *entries(): Generator<{ tenant: string; agent: string; candidates: StoredCandidate[] }> {
    for (const s of this.scopes.values())
      yield { tenant: s.tenant, agent: s.agent, candidates: [...s.c.values()] };
  }
  get size(): number {
    let n = 0;
    for (const s of this.scopes.values()) n += s.c.size;
    return n;
  }
}

/** Writes candidate states to the topic (before Redis: the topic is the one that must not miss a decision). */
export function stateWriter(sink: Sink, topic: string, states: CandidateStates) {
  return async (tenant: string, agent: string, candidates: readonly StoredCandidate[]) => {
    if (!candidates.length) return;
    await sink.sendRaw(
      topic,
      candidates.map((c) => {
        const v: CandidateState = { schema_version: 1, tenant_id: tenant, agent_id: agent, candidate: c };
        return { key: candidateStateKey(tenant, agent, c.record.dedupe_key), value: JSON.stringify(v) };
      }),
    );
    for (const c of candidates) states.set(tenant, agent, c);
  };
}

/** `onState`: every state read, this instance's and other instances' alike, as the topic has them. */
export function createStateFeed(
  states: CandidateStates,
  place: TablePlace,
  runtime: RuntimeDeps,
  onState?: (tenant: string, agent: string, c: StoredCandidate) => void,
): TableFeed {
  return createTableFeed<CandidateState>(
    {
      ...place,
      service: 'flows',
      parse: zodParser(candidateStateV1),
      apply: (v) => {
        states.set(v.tenant_id, v.agent_id, v.candidate);
        onState?.(v.tenant_id, v.agent_id, v.candidate);
      },
    },
    runtime,
  );
}
