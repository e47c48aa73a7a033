import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { PaverError } from '../../../../shared/errors.js';
import { createHttpServer, type HttpRequest, type Route } from '../../../../shared/http.js';
import { createLogger } from '../../../../shared/log.js';
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
  ensureState: () => Promise.resolve(),
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

/** Runs `use` against a real HTTP server serving `routes` on a free loopback port, then closes it. */
async function withServer(routes: Route[], use: (port: number) => Promise<void>): Promise<void> {
  const server = createHttpServer({
    registry: new Registry(),
    log: createLogger('t', 'silent'),
    readiness: [],
    routes,
  });
  const port = await server.listen(0, '127.0.0.1');
  try {
    await use(port);
  } finally {
    await server.close();
  }
}

describe('POST /flows/select', () => {
  it('answers 415 to a body that is not JSON by its Content-Type, before selecting', async () => {
    const asked: string[] = [];
    const routes = flowRoutes({
      ...deps,
      select: (_t: string, _a: string, query: string) => (
        asked.push(query),
        Promise.resolve({ path: 'none' })
      ),
    } as unknown as HttpDeps);
    await withServer(routes, async (port) => {
      const post = (headers: Record<string, string>) =>
        fetch(`http://127.0.0.1:${port}/flows/select`, {
          method: 'POST',
          headers,
          body: JSON.stringify({ query: 'refund my order' }),
        });
      // Before: 200, the text/plain body (what fetch and curl -d send by default) read as JSON.
      for (const type of ['text/plain;charset=UTF-8', 'application/x-www-form-urlencoded']) {
        const res = await post({ 'content-type': type });
        expect(res.status, type).toBe(415);
        expect(((await res.json()) as { error: string }).error).toMatch(/^request body must be JSON/);
      }
      expect(asked).toEqual([]);
      const ok = await post({ 'content-type': 'application/json; charset=utf-8' });
      expect(ok.status).toBe(200);
      expect(asked).toEqual(['refund my order']);
    });
  });
});

describe('POST /flows/candidates/:key/promote|reject', () => {
  it('take no body: content that is not JSON is refused with 415, other JSON than {} with 400, before any decision', async () => {
    const decided: string[] = [];
    const routes = flowRoutes({
      ...deps,
      decide: (tenant: string, agent: string, key: string, to: string) => (
        decided.push(`${to} ${tenant}/${agent}/${key}`),
        Promise.resolve({ outcome: { kind: 'rejected', next: candidate(key, 'rejected') }, flow: null })
      ),
    } as unknown as HttpDeps);
    await withServer(routes, async (port) => {
      const post = async (verb: string, headers: Record<string, string>, body?: string) => {
        const res = await fetch(`http://127.0.0.1:${port}/flows/candidates/k/${verb}?tenant_id=acme`, {
          method: 'POST',
          headers,
          body,
        });
        return { status: res.status, error: ((await res.json()) as { error?: string }).error };
      };
      for (const verb of ['promote', 'reject']) {
        // Before: 200 and the decision made, whatever the body (read by no one).
        for (const type of ['text/plain;charset=UTF-8', 'application/x-www-form-urlencoded']) {
          const r = await post(verb, { 'content-type': type }, 'tenant_id=other');
          expect(r.status, `${verb} ${type}`).toBe(415);
          expect(r.error).toMatch(/^request body must be JSON/);
        }
        // Select's scope is in its body; here it would have been ignored, and the default tenant's decided.
        for (const body of ['{"tenant_id":"other"}', '[]', 'null', '"promote"']) {
          const r = await post(verb, { 'content-type': 'application/json' }, body);
          expect(r, `${verb} ${body}`).toEqual({
            status: 400,
            error: 'this route takes no body: the scope goes in the query (?tenant_id=…&agent_id=…)',
          });
        }
        expect((await post(verb, { 'content-type': 'application/json' }, '{')).status).toBe(400);
      }
      expect(decided).toEqual([]);
      // No body (curl -X POST, the CLI), an empty form (curl -d ''), and {} are decisions.
      expect((await post('reject', {})).status).toBe(200);
      expect((await post('reject', { 'content-type': 'application/x-www-form-urlencoded' }, '')).status).toBe(
        200,
      );
      expect((await post('promote', { 'content-type': 'application/json' }, '{}')).status).toBe(200);
      expect(decided).toEqual(['reject acme/default/k', 'reject acme/default/k', 'promote acme/default/k']);
    });
  });
});

describe('/flows/candidates routes while the state is not ready', () => {
  it('answer a malformed request with its 4xx at once, a well-formed one with 503 (Redis lost) or after the rebuild', async () => {
    const used: string[] = [];
    let state: () => Promise<void> = () =>
      Promise.reject(new PaverError('REDIS_UNAVAILABLE', 'redis state rebuild failed'));
    const routes = flowRoutes({
      store: {
        listCandidates: () => (used.push('list'), Promise.resolve([])),
        getCandidates: () => (used.push('get'), Promise.resolve(new Map())),
      },
      decide: (_t: string, _a: string, key: string, to: string) => (
        used.push(to),
        Promise.resolve({ outcome: { kind: 'rejected', next: candidate(key, 'rejected') }, flow: null })
      ),
      select: () => (used.push('select'), Promise.resolve({ path: 'none' })),
      ensureState: () => state(),
    } as unknown as HttpDeps);
    await withServer(routes, async (port) => {
      const ask = async (path: string, init?: { type?: string; body?: string }) => {
        const res = await fetch(`http://127.0.0.1:${port}${path}`, {
          method: init ? 'POST' : 'GET',
          headers: init?.type ? { 'content-type': init.type } : {},
          body: init?.body,
        });
        return res.status;
      };
      const malformed = async () => {
        for (const verb of ['promote', 'reject']) {
          const path = `/flows/candidates/k/${verb}`;
          // Before: 503 (or a wait for the rebuild) for each, the body read only once the state was ready.
          expect(await ask(path, { type: 'text/plain', body: 'x' }), `${verb} text`).toBe(415);
          expect(await ask(path, { type: 'application/json', body: '{"tenant_id":"a"}' }), verb).toBe(400);
          expect(await ask(path, { type: 'application/json', body: '{' }), `${verb} {`).toBe(400);
          expect(await ask(`${path}?tenant_id=`, {}), `${verb} scope`).toBe(400);
        }
        expect(await ask('/flows/candidates?status=promotd')).toBe(400);
        expect(await ask('/flows/candidates?agent_id=')).toBe(400);
        expect(await ask('/flows/candidates/k?tenant_id=')).toBe(400);
        // Selection does not use the candidates' state: answered whatever it is, malformed or not.
        expect(await ask('/flows/select', { type: 'text/plain', body: '{"query":"q"}' })).toBe(415);
        expect(await ask('/flows/select', { type: 'application/json', body: '{}' })).toBe(400);
      };

      await malformed();
      for (const path of ['/flows/candidates', '/flows/candidates/k'])
        expect(await ask(path), path).toBe(503);
      for (const verb of ['promote', 'reject'])
        expect(await ask(`/flows/candidates/k/${verb}`, {}), verb).toBe(503);
      expect(used).toEqual([]);
      expect(await ask('/flows/select', { type: 'application/json', body: '{"query":"q"}' })).toBe(200);

      // A rebuild under way: malformed requests do not wait for it; a well-formed one answers once it is done.
      let rebuilt!: () => void;
      const rebuild = new Promise<void>((r) => (rebuilt = r));
      state = () => rebuild;
      await malformed();
      const waiting = ask('/flows/candidates/k/promote', {});
      await malformed();
      expect(used).toEqual(['select']);
      rebuilt();
      expect(await waiting).toBe(200);
      expect(used).toEqual(['select', 'promote']);
    });
  });
});
