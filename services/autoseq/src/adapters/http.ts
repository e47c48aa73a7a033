import { id as idSchema } from '../../../../schemas/index.js';
import { PaverError } from '../../../../shared/errors.js';
import type { Route } from '../../../../shared/http.js';
import { DEFAULT_LEARN, listRules } from '../core/learn/learner.js';
import type { LearnOptions, ScopeState } from '../core/learn/learner.js';

/** `GET /rules?tenant_id&agent_id`: the learned rules of one scope (read-only). */
export function rulesRoute(
  readScope: (tenant: string, agent: string) => Promise<ScopeState | null>,
  opts: LearnOptions = DEFAULT_LEARN,
): Route {
  return {
    method: 'GET',
    path: '/rules',
    query: ['tenant_id', 'agent_id'],
    async handler(req) {
      const tenant = req.query.get('tenant_id') ?? 'default';
      const agent = req.query.get('agent_id') ?? 'default';
      // The ids' contract (length, no control characters), as on every other route.
      if (!idSchema.safeParse(tenant).success || !idSchema.safeParse(agent).success)
        return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
      const scope = await readScope(tenant, agent);
      return {
        status: 200,
        body: { tenant_id: tenant, agent_id: agent, rules: scope ? listRules(scope, opts) : [] },
      };
    },
  };
}

/** Reads after a Redis loss met mid-read before the route gives up (503: retriable). */
const READ_ATTEMPTS = 3;

/**
 * A scope read for `GET /rules` that answers from the state the guard vouched for: `ensure` (the guard's check,
 * and the restore after a loss) runs first, and `read` fails (`STATE_CONTENDED`, see `stateLostMidRead`) when
 * Redis lost its state between that check and the read; then the guard is asked again, which restores first.
 * Without the second check, a loss in that gap answered 200 with no rules from the empty Redis.
 */
export function guardedScopeRead(
  ensure: () => Promise<void>,
  read: (tenant: string, agent: string) => Promise<ScopeState | null>,
): (tenant: string, agent: string) => Promise<ScopeState | null> {
  return async (tenant, agent) => {
    for (let attempt = 1; ; attempt++) {
      await ensure();
      try {
        return await read(tenant, agent);
      } catch (err) {
        if (attempt >= READ_ATTEMPTS || !(err instanceof PaverError && err.code === 'STATE_CONTENDED'))
          throw err;
      }
    }
  };
}

/**
 * `POST /rules/forget?tenant_id&agent_id`: forgets what one scope learned, in Redis and on the rules topic
 * (`ScopeRetirement.forget`), so that no restore brings it back. 200 with whether it had state and how many
 * context records were tombstoned; 503 (retry) when Redis lost its state meanwhile or a restore is under way.
 */
export function forgetRoute(
  forget: (tenant: string, agent: string) => Promise<{ state: boolean; contexts: number }>,
): Route {
  return {
    method: 'POST',
    path: '/rules/forget',
    query: ['tenant_id', 'agent_id'],
    async handler(req) {
      // Both named: forgetting the default scope by a forgotten parameter is not undone.
      const tenant = req.query.get('tenant_id');
      const agent = req.query.get('agent_id');
      if (
        tenant === null ||
        agent === null ||
        !idSchema.safeParse(tenant).success ||
        !idSchema.safeParse(agent).success
      )
        return { status: 400, body: { error: 'tenant_id and agent_id are required' } };
      const r = await forget(tenant, agent);
      return {
        status: 200,
        body: {
          tenant_id: tenant,
          agent_id: agent,
          forgotten: true,
          had_state: r.state,
          contexts: r.contexts,
        },
      };
    },
  };
}
