import { id as idSchema } from '../../../../schemas/index.js';
import type { Route } from '../../../../shared/http.js';
import { liveCandidates } from '../core/detect.js';
import type { Scope } from '../core/ops.js';
import type { DetectorParams } from '../core/params.js';
import type { RedisDetectorStore } from './redis/store.js';

/** `GET /candidates?tenant_id&agent_id`: one scope's live candidates, the JSON array `paver detect` prints. */
export function candidatesRoute(store: Pick<RedisDetectorStore, 'snapshot'>, params: DetectorParams): Route {
  return {
    method: 'GET',
    path: '/candidates',
    query: ['tenant_id', 'agent_id'],
    async handler(req) {
      const scope: Scope = {
        tenant: req.query.get('tenant_id') ?? 'default',
        agent: req.query.get('agent_id') ?? 'default',
      };
      if (!idSchema.safeParse(scope.tenant).success || !idSchema.safeParse(scope.agent).success) {
        return {
          status: 400,
          body: { error: 'tenant_id and agent_id must be 1-256 characters without control characters' },
        };
      }
      const snap = await store.snapshot(scope);
      return { status: 200, body: liveCandidates(snap.stats, params, snap.records) };
    },
  };
}
