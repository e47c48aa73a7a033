import { id as idSchema, toolName } from '../../../../schemas/index.js';
import type { Route } from '../../../../shared/http.js';
import type { Orchestrations } from '../core/orchestration.js';
import { settle, view, type SessionState } from '../core/session.js';
import type { SessionRef } from './redis/store.js';

const BAD_ID = 'session_id, tenant_id and agent_id must be 1-256 characters without control characters';

/** `GET /sessions/:session_id/allowed-tools?tools=a,b[&tenant_id&agent_id]`: the allowed tools now. */
export function allowedToolsRoute(
  config: Orchestrations,
  readState: (ref: SessionRef) => Promise<SessionState>,
): Route {
  return {
    method: 'GET',
    path: '/sessions/:session_id/allowed-tools',
    async handler(req) {
      const ref = {
        tenant: req.query.get('tenant_id') ?? 'default',
        agent: req.query.get('agent_id') ?? 'default',
        session: req.params.session_id ?? '',
      };
      if (![ref.tenant, ref.agent, ref.session].every((x) => idSchema.safeParse(x).success))
        return { status: 400, body: { error: BAD_ID } };
      const toolsParam = req.query.get('tools');
      const tools =
        toolsParam === null
          ? null
          : toolsParam
              .split(',')
              .map((t) => t.trim())
              .filter(Boolean);
      if (tools && (tools.length > 10_000 || !tools.every((t) => toolName.safeParse(t).success)))
        return { status: 400, body: { error: 'tools must be a comma-separated list of tool names' } };
      const agent = config.get(ref.tenant, ref.agent);
      const state = { ...(await readState(ref)) };
      // The step the next event would be processed in: a session never seen is in the step the rule picks for
      // an empty session (the default step, if any); a finished sequence gives way to the rule's pick.
      if (agent) settle(agent, state);
      return {
        status: 200,
        body: { session_id: ref.session, ...view(agent, state, tools ?? agent?.tools ?? []) },
      };
    },
  };
}
