import { id as idSchema } from '../../../../schemas/index.js';
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
