import { v5 as uuidv5 } from 'uuid';
import type { FlowCandidateRecord, FlowDefinition, RegisteredFlow } from '../../../../schemas/index.js';
import { Bm25Index } from './bm25.js';

/** Namespace of Paver flow ids (UUID v5): the same definition key always gives the same id. */
export const FLOW_NAMESPACE = '6f0e6a55-6d2f-5b6e-9c39-7061766572f1';
export const manualFlowId = (d: Pick<FlowDefinition, 'tenant_id' | 'agent_id' | 'name'>) =>
  uuidv5(`manual:${d.tenant_id}/${d.agent_id}/${d.name}`, FLOW_NAMESPACE);
export const promotedFlowId = (dedupeKey: string) => uuidv5(`candidate:${dedupeKey}`, FLOW_NAMESPACE);

export const scopeId = (tenant: string, agent: string) => `${tenant}\u001f${agent}`;

/** The text sparse retrieval sees: name, description, condition and desired effects. */
export const searchText = (f: RegisteredFlow) =>
  [f.name, f.description, f.condition, ...f.desired_effects].join('\n');

class ScopeRegistry {
  readonly flows = new Map<string, RegisteredFlow>();
  readonly bm25 = new Bm25Index();
  readonly vectors = new Map<string, number[]>();
}

/** Registered flows per (tenant, agent), with their sparse index and, when an embedder is configured, vectors. */
export class FlowRegistry {
  private readonly scopes = new Map<string, ScopeRegistry>();

  private scope(tenant: string, agent: string, create: true): ScopeRegistry;
  private scope(tenant: string, agent: string, create?: false): ScopeRegistry | undefined;
  private scope(tenant: string, agent: string, create = false) {
    const k = scopeId(tenant, agent);
    let s = this.scopes.get(k);
    if (!s && create) this.scopes.set(k, (s = new ScopeRegistry()));
    return s;
  }

  upsert(f: RegisteredFlow): void {
    // The same id may move scope only by a bug upstream; remove it everywhere first so it is never listed twice.
    this.remove(f.id);
    const s = this.scope(f.tenant_id, f.agent_id, true);
    s.flows.set(f.id, f);
    s.bm25.add(f.id, searchText(f));
  }
  remove(id: string): RegisteredFlow | undefined {
    for (const s of this.scopes.values()) {
      const f = s.flows.get(id);
      if (f) {
        s.flows.delete(id);
        s.bm25.remove(id);
        s.vectors.delete(id);
        return f;
      }
    }
    return undefined;
  }
  get(tenant: string, agent: string, id: string): RegisteredFlow | undefined {
    return this.scope(tenant, agent)?.flows.get(id);
  }
  list(tenant: string, agent: string): RegisteredFlow[] {
    return [...(this.scope(tenant, agent)?.flows.values() ?? [])];
  }
  setVector(tenant: string, agent: string, id: string, v: number[]): void {
    this.scope(tenant, agent)?.vectors.set(id, v);
  }
  missingVectors(): RegisteredFlow[] {
    return [...this.scopes.values()].flatMap((s) =>
      [...s.flows.values()].filter((f) => !s.vectors.has(f.id)),
    );
  }
  index(
    tenant: string,
    agent: string,
  ): { bm25: Bm25Index; vectors: Map<string, number[]>; flows: Map<string, RegisteredFlow> } | undefined {
    return this.scope(tenant, agent);
  }
  get size(): number {
    let n = 0;
    for (const s of this.scopes.values()) n += s.flows.size;
    return n;
  }
}

export function registerManual(d: FlowDefinition, now: number): RegisteredFlow {
  return { ...d, id: d.id ?? manualFlowId(d), source: 'manual', registered_at: now };
}

/** A promoted candidate as a flow: the proposed flow, described by its tools, with the detector's prompt hint. */
export function flowFromCandidate(r: FlowCandidateRecord, now: number): RegisteredFlow {
  const pf = r.promotion_effect?.proposed_flow ?? r.candidate?.proposed_flow;
  const tools = r.candidate?.tool_sequence ?? pf?.steps.map((s) => s.skill_key) ?? [];
  return {
    id: promotedFlowId(r.dedupe_key),
    tenant_id: r.tenant_id,
    agent_id: r.agent_id,
    name: pf?.name ?? r.title,
    description: pf?.description ?? r.title,
    condition: `Requests the agent has handled by running ${tools.join(' then ')}.`,
    desired_effects: [r.title, ...(pf?.tags ?? [])].filter(Boolean),
    steps: pf?.steps ?? [],
    ...(r.promotion_effect?.agent_prompt_hint
      ? { agent_prompt_hint: r.promotion_effect.agent_prompt_hint }
      : {}),
    source: 'promoted',
    dedupe_key: r.dedupe_key,
    registered_at: now,
  };
}
