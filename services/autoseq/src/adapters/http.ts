import type { Route } from '../../../../shared/http.js';
import { listRules } from '../core/learn/learner.js';
import type { ScopeState } from '../core/learn/learner.js';

/** `GET /rules?tenant_id&agent_id`: the learned rules of one scope (read-only). */
export function rulesRoute(readScope: (tenant: string, agent: string) => Promise<ScopeState | null>): Route {
  return {
    method: 'GET',
    path: '/rules',
    async handler(req) {
      const tenant = req.query.get('tenant_id') ?? 'default';
      const agent = req.query.get('agent_id') ?? 'default';
      if (!tenant || !agent || tenant.length > 256 || agent.length > 256)
        return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
      const scope = await readScope(tenant, agent);
      return {
        status: 200,
        body: { tenant_id: tenant, agent_id: agent, rules: scope ? listRules(scope) : [] },
      };
    },
  };
}
