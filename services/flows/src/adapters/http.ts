import { z } from 'zod';
import { id as idSchema, LIMITS, type RegisteredFlow } from '../../../../schemas/index.js';
import { errorMessage } from '../../../../shared/errors.js';
import type { Route } from '../../../../shared/http.js';
import { describeIssues } from '../../../../shared/jsonl.js';
import type { Logger } from '../../../../shared/log.js';
import { wilsonLower } from '../../../../shared/core/wilson.js';
import {
  shadowPrecision,
  type CandidateStatus,
  type ManualDecision,
  type StoredCandidate,
} from '../core/promotion.js';
import type { FlowRegistry } from '../core/registry.js';
import type { Selection, SelectPolicy } from '../core/select.js';
import type { RedisFlowStore } from './redis/store.js';
import { select, type SelectorDeps } from './selector.js';

const selectBody = z
  .object({
    query: z.string().min(1).max(LIMITS.textLength),
    summaries: z.array(z.string().max(LIMITS.textLength)).max(LIMITS.summaries).default([]),
    tenant_id: idSchema.default('default'),
    agent_id: idSchema.default('default'),
  })
  .strict();

export interface HttpDeps {
  store: RedisFlowStore;
  registry: FlowRegistry;
  /** An operator's decision, made and stored as the engine makes every other (FlowsEngine.decide). */
  decide: (
    tenant: string,
    agent: string,
    key: string,
    to: 'promote' | 'reject',
  ) => Promise<{ outcome: ManualDecision; flow: RegisteredFlow | null }>;
  select: (tenant: string, agent: string, query: string, summaries: string[]) => Promise<Selection>;
  /**
   * Waits for the candidates' Redis state to be whole (the state guard's `ensure`; it throws, a 503, when it
   * cannot be). Asked only once a request is found well-formed: a malformed one gets its 4xx whatever the state.
   */
  ensureState: () => Promise<void>;
}

export interface SelectOnDemandDeps {
  selector: SelectorDeps;
  /** The scope's selection settings (FLOWS_* with FLOWS_POLICY_FILE's entry for it). */
  policy: (tenant: string, agent: string) => SelectPolicy;
  /** Reads the scope's past outcomes from Redis into the outcome memory, once (FlowsEngine.ensureRuns). */
  ensureRuns: (tenant: string, agent: string) => Promise<void>;
  onSelection: (path: Selection['path']) => void;
  log: Logger;
}

/** POST /flows/select's selection (`HttpDeps.select`): as for a session's request, with the scope's past outcomes. */
export const selectOnDemand =
  (d: SelectOnDemandDeps): HttpDeps['select'] =>
  async (t, a, query, summaries) => {
    // The scope's past outcomes rank as they do for its sessions' selections: an instance that reads none of
    // the scope's sessions (or has not yet since its start) has them only from Redis. Without Redis, the
    // selection is still made, without them (it needs no Redis state otherwise), and the read tried again next
    // time. A scope with no flow has nothing to rank: its runs are neither read nor marked read, so the ids
    // a client makes up cost no Redis read and no memory (an event batch of the scope reads them when it comes).
    if (d.selector.registry.index(t, a)?.flows.size)
      await d
        .ensureRuns(t, a)
        .catch((err: unknown) =>
          d.log.debug({ err: errorMessage(err) }, 'past outcomes not read for a selection'),
        );
    const sel = await select(d.selector, t, a, query, summaries, d.policy(t, a));
    d.onSelection(sel.path);
    return sel;
  };

const CANDIDATE_STATUSES = [
  'pending',
  'promoted',
  'rejected',
  'retracted',
] as const satisfies readonly CandidateStatus[];

const SCOPE = ['tenant_id', 'agent_id'] as const;

const scopeOf = (q: URLSearchParams) => ({
  tenant: q.get('tenant_id') ?? 'default',
  agent: q.get('agent_id') ?? 'default',
});
const badScope = (s: { tenant: string; agent: string }) =>
  !idSchema.safeParse(s.tenant).success || !idSchema.safeParse(s.agent).success;

/** What `paver flows list|show` prints of a candidate (the shadow record included). */
export const summary = (c: StoredCandidate) => {
  const sp = shadowPrecision(c);
  return {
    dedupe_key: c.record.dedupe_key,
    title: c.record.title,
    status: c.status,
    retracted: c.retracted,
    occurrence_count: c.record.occurrence_count,
    estimated_token_savings: c.record.estimated_token_savings,
    detected_at: c.record.detected_at,
    decided_at: c.decided_at,
    shadow_trials: c.shadow_trials,
    shadow_precision: sp === null ? null : Number(sp.toFixed(4)),
    shadow_precision_lower: Number(wilsonLower(c.shadow_matched, c.shadow_proposed).toFixed(4)),
  };
};

/** The flows service's HTTP API: candidates and their decisions, the registry, and selection on demand. */
export function flowRoutes(d: HttpDeps): Route[] {
  const decideRoute =
    (to: 'promote' | 'reject'): Route['handler'] =>
    async (req) => {
      // No body, or `{}` (what some clients send with every POST): content of another type is refused with 415,
      // as by POST /flows/select, and any other JSON with 400 before a decision. A body was read by no one: a
      // `{"tenant_id": …}` (select's scope is in its body) decided in the default scope, or in none.
      const body = await req.body();
      if (
        body !== undefined &&
        !(typeof body === 'object' && body !== null && !Array.isArray(body) && Object.keys(body).length === 0)
      )
        return {
          status: 400,
          body: { error: 'this route takes no body: the scope goes in the query (?tenant_id=…&agent_id=…)' },
        };
      const s = scopeOf(req.query);
      if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
      const key = req.params.key ?? '';
      await d.ensureState();
      const { outcome: o, flow } = await d.decide(s.tenant, s.agent, key, to);
      switch (o.kind) {
        case 'not_found':
          return { status: 404, body: { error: `no candidate '${key}' for ${s.tenant}/${s.agent}` } };
        case 'conflict':
          return { status: 409, body: { error: o.error } };
        case 'unpromotable':
          return { status: 422, body: { error: `this candidate cannot become a valid flow: ${o.error}` } };
        case 'rejected':
          return { status: 200, body: summary(o.next) };
        case 'promoted':
          return { status: 200, body: { flow } };
      }
    };
  return [
    {
      method: 'GET',
      path: '/flows/candidates',
      query: [...SCOPE, 'status'],
      async handler(req) {
        const s = scopeOf(req.query);
        if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
        const status = req.query.get('status');
        // A misspelt status filtered everything out: an empty list, as if there were no such candidates.
        if (status !== null && !(CANDIDATE_STATUSES as readonly string[]).includes(status))
          return { status: 400, body: { error: `status must be one of ${CANDIDATE_STATUSES.join(', ')}` } };
        await d.ensureState();
        const all = (await d.store.listCandidates(s.tenant, s.agent)).filter(
          (c) => !status || c.status === status,
        );
        return {
          status: 200,
          body: all
            .sort((x, y) => y.record.estimated_token_savings - x.record.estimated_token_savings)
            .map(summary),
        };
      },
    },
    {
      method: 'GET',
      path: '/flows/candidates/:key',
      query: SCOPE,
      async handler(req) {
        const s = scopeOf(req.query);
        if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
        const key = req.params.key ?? '';
        await d.ensureState();
        const c = (await d.store.getCandidates(s.tenant, s.agent, [key])).get(key);
        return c
          ? { status: 200, body: { ...summary(c), record: c.record } }
          : { status: 404, body: { error: 'no such candidate' } };
      },
    },
    { method: 'POST', path: '/flows/candidates/:key/promote', query: SCOPE, handler: decideRoute('promote') },
    { method: 'POST', path: '/flows/candidates/:key/reject', query: SCOPE, handler: decideRoute('reject') },
    {
      method: 'GET',
      path: '/flows',
      query: SCOPE,
      handler(req) {
        const s = scopeOf(req.query);
        if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
        return {
          status: 200,
          body: d.registry
            .list(s.tenant, s.agent)
            .map((f) => ({ id: f.id, name: f.name, source: f.source, dedupe_key: f.dedupe_key ?? null })),
        };
      },
    },
    {
      method: 'POST',
      path: '/flows/select',
      // The scope is in the body: a `?tenant_id=` here would be ignored, and the default tenant's flows chosen.
      query: [],
      async handler(req) {
        const b = selectBody.safeParse(await req.body());
        if (!b.success) return { status: 400, body: { error: describeIssues(b.error.issues) } };
        const sel = await d.select(b.data.tenant_id, b.data.agent_id, b.data.query, b.data.summaries);
        return { status: 200, body: sel };
      },
    },
  ];
}
