import { describe, expect, it } from 'vitest';
import { rulesRoute } from '../../services/autoseq/src/adapters/http.js';
import { flowRoutes, type HttpDeps } from '../../services/flows/src/adapters/http.js';
import { FlowRegistry } from '../../services/flows/src/core/registry.js';

/** Every route that takes a scope refuses ids its contract refuses (control characters, over 256 characters). */
const request = (query: string) => ({
  method: 'GET',
  path: '/',
  params: {},
  query: new URLSearchParams(query),
  body: async () => undefined,
});
const bad = ['tenant_id=a%01b', `agent_id=${'x'.repeat(257)}`, 'tenant_id='];

describe('scope ids on HTTP routes', () => {
  it('autoseq GET /rules: 400 for a bad id, the scope read only for good ones', async () => {
    const read: string[] = [];
    const route = rulesRoute(async (t, a) => (read.push(`${t}/${a}`), null));
    for (const q of bad) expect((await route.handler(request(q))).status, q).toBe(400);
    expect((await route.handler(request('tenant_id=acme'))).status).toBe(200);
    expect(read).toEqual(['acme/default']);
  });

  it('flows GET /flows: 400 for a bad id', async () => {
    const deps = { registry: new FlowRegistry() } as unknown as HttpDeps;
    const route = flowRoutes(deps).find((r) => r.method === 'GET' && r.path === '/flows')!;
    for (const q of bad) expect((await route.handler(request(q))).status, q).toBe(400);
    expect((await route.handler(request('tenant_id=acme'))).status).toBe(200);
  });
});
