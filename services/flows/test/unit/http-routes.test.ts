import { describe, expect, it } from 'vitest';
import type { HttpRequest } from '../../../../shared/http.js';
import { flowRoutes, type HttpDeps } from '../../src/adapters/http.js';
import type { StoredCandidate } from '../../src/core/promotion.js';

const candidate = (key: string, status: StoredCandidate['status']) =>
  ({
    record: { dedupe_key: key, title: key, occurrence_count: 3, estimated_token_savings: 10, detected_at: 1 },
    status,
    retracted: false,
    decided_at: null,
    shadow_trials: 0,
    shadow_proposed: 0,
    shadow_matched: 0,
  }) as unknown as StoredCandidate;

const deps = {
  store: { listCandidates: () => Promise.resolve([candidate('a', 'pending'), candidate('b', 'promoted')]) },
} as unknown as HttpDeps;
const list = flowRoutes(deps).find((r) => r.method === 'GET' && r.path === '/flows/candidates')!;
const get = async (query: string) => {
  const req: HttpRequest = {
    method: 'GET',
    path: '/flows/candidates',
    params: {},
    query: new URLSearchParams(query),
    body: () => Promise.resolve(undefined),
  };
  const res = await list.handler(req);
  return { status: res.status, body: res.body };
};

describe('GET /flows/candidates?status=', () => {
  it('filters by a known status, and refuses an unknown or empty one with 400 instead of an empty list', async () => {
    expect(await get('status=promoted')).toMatchObject({ status: 200, body: [{ dedupe_key: 'b' }] });
    expect((await get('')).body).toHaveLength(2);
    // Before: 200 [] (a misspelt filter read as "no such candidates").
    for (const q of ['status=promotd', 'status=', 'status=PENDING'])
      expect(await get(q), q).toEqual({
        status: 400,
        body: { error: 'status must be one of pending, promoted, rejected, retracted' },
      });
  });
});

describe('query parameters of the flows routes', () => {
  it('every route names the ones it takes: the scope (and status), none for select, whose scope is in the body', () => {
    const byRoute = Object.fromEntries(flowRoutes(deps).map((r) => [`${r.method} ${r.path}`, r.query]));
    const scope = ['tenant_id', 'agent_id'];
    expect(byRoute).toEqual({
      'GET /flows/candidates': [...scope, 'status'],
      'GET /flows/candidates/:key': scope,
      'POST /flows/candidates/:key/promote': scope,
      'POST /flows/candidates/:key/reject': scope,
      'GET /flows': scope,
      'POST /flows/select': [],
    });
  });
});
