import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { createHttpServer, parseTarget } from '../../shared/http.js';
import { createLogger } from '../../shared/log.js';
import { parsePrometheus } from '../helpers/prometheus.js';

const registry = new Registry();
const server = createHttpServer({
  registry,
  log: createLogger('test', 'silent'),
  readiness: [{ name: 'x', check: () => true }],
  routes: [
    { method: 'GET', path: '/sessions/:id/allowed-tools', handler: () => ({ status: 200, body: { ok: 1 } }) },
    {
      method: 'POST',
      path: '/boom',
      handler: () => {
        throw new Error('no');
      },
    },
  ],
});
afterAll(() => server.close());

describe('HTTP latency histogram', () => {
  it('observes every request by method, route pattern and status, never the raw path', async () => {
    const port = await server.listen(0, '127.0.0.1');
    const get = (p: string, method = 'GET') => fetch(`http://127.0.0.1:${port}${p}`, { method });
    for (const id of ['s-secret-1', 's-secret-2']) await (await get(`/sessions/${id}/allowed-tools`)).text();
    await (await get('/readyz')).text();
    await (await get('/nowhere/s-secret-3')).text();
    await (await get('/boom', 'POST')).text();
    const text = await registry.metrics();
    expect(text).not.toContain('secret');
    const m = parsePrometheus(text);
    const count = (labels: Record<string, string>) =>
      m.value('paver_http_request_duration_seconds_count', labels);
    expect(count({ method: 'GET', route: '/sessions/:id/allowed-tools', status: '200' })).toBe(2);
    expect(count({ method: 'GET', route: '/readyz', status: '200' })).toBe(1);
    expect(count({ method: 'GET', route: 'unmatched', status: '404' })).toBe(1);
    expect(count({ method: 'POST', route: '/boom', status: '500' })).toBe(1);
  });

  it('a second server on the same registry shares the histogram', () => {
    expect(() =>
      createHttpServer({ registry, log: createLogger('test', 'silent'), readiness: [] }),
    ).not.toThrow();
  });
});

describe('request target parsing', () => {
  it('gives the path and query URL would, for any target', () => {
    const alphabet = [
      'a',
      'Z',
      '0',
      '/',
      '//',
      '.',
      '..',
      '%2e',
      '%2E',
      '%41',
      '%',
      '?',
      '&',
      '=',
      '+',
      '#',
      ' ',
      '"',
    ];
    alphabet.push("'", '<', '{', '`', '\\', '\t', 'é', '~', '@', ':', ';', ',', '*', '!', '$', '(', '[');
    let seed = 1;
    const r = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const targets = ['/', '/?', '/sessions/s-1/allowed-tools?tools=a,b&tenant_id=t', 'http://h/x?y=1', '*'];
    for (let i = 0; i < 5000; i++)
      targets.push(
        '/' +
          Array.from(
            { length: 1 + Math.floor(r() * 12) },
            () => alphabet[Math.floor(r() * alphabet.length)],
          ).join(''),
      );
    for (const t of targets) {
      let url: URL;
      try {
        url = new URL(t, 'http://localhost');
      } catch {
        expect(() => parseTarget(t), t).toThrow(); // a '//' target whose host does not parse
        continue;
      }
      const got = parseTarget(t);
      expect([got.pathname, [...got.query]], t).toEqual([url.pathname, [...url.searchParams]]);
    }
  });
});
