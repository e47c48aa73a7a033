import { connect } from 'node:net';
import { Registry } from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import {
  createHttpServer,
  HEADERS_TIMEOUT_MS,
  parseTarget,
  type ReadinessCheck,
  type Route,
} from '../../shared/http.js';
import { PaverError } from '../../shared/errors.js';
import { createLogger } from '../../shared/log.js';
import { parsePrometheus } from '../helpers/prometheus.js';

/** A server of its own for one test: a fresh registry, silent logs. */
const serverWith = (o: { readiness: ReadinessCheck[]; routes?: Route[]; readinessTimeoutMs?: number }) =>
  createHttpServer({ registry: new Registry(), log: createLogger('test', 'silent'), ...o });

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
let listening: Promise<number> | null = null;
const listen = () => (listening ??= server.listen(0, '127.0.0.1'));

describe('HTTP latency histogram', () => {
  it('observes every request by method, route pattern and status, never the raw path', async () => {
    const port = await listen();
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

describe('requests from web pages', () => {
  it('refuses a POST that carries an Origin header (another site’s page) before its handler runs; GETs and plain clients pass', async () => {
    const port = await listen();
    const post = (headers: Record<string, string>) =>
      fetch(`http://127.0.0.1:${port}/boom`, { method: 'POST', headers }).then((r) => r.status);
    expect(await post({ origin: 'https://evil.example' })).toBe(403);
    expect(await post({})).toBe(500);
    const get = await fetch(`http://127.0.0.1:${port}/sessions/s/allowed-tools`, {
      headers: { origin: 'https://evil.example' },
    });
    expect(get.status).toBe(200);
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

describe('requests a URL parser refuses', () => {
  /** The status line of the answer to a raw request line (what a client library would not send). */
  async function raw(port: number, requestLine: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const socket = connect(port, '127.0.0.1', () =>
        socket.write(`${requestLine}\r\nHost: x\r\nConnection: close\r\n\r\n`),
      );
      let got = '';
      socket.on('data', (d) => (got += d.toString()));
      socket.on('end', () => resolve(got.split('\r\n')[0] ?? ''));
      socket.on('error', reject);
    });
  }

  it('answers 400 to a target no URL takes and to a bad escape in a path parameter, and keeps serving', async () => {
    const port = await listen();
    // Before, the first one threw out of the request handler: an unhandled rejection, which ends the process.
    expect(await raw(port, 'GET http://[/x HTTP/1.1')).toBe('HTTP/1.1 400 Bad Request');
    expect(await raw(port, 'GET /sessions/%E0%A4%A/allowed-tools HTTP/1.1')).toBe('HTTP/1.1 400 Bad Request');
    expect(await raw(port, 'GET /sessions/s-1/allowed-tools HTTP/1.1')).toBe('HTTP/1.1 200 OK');
  });
});

describe('readiness', () => {
  it('answers 503 within the check timeout when a check hangs (a frozen dependency), naming the check and why', async () => {
    const s = serverWith({
      readiness: [
        { name: 'fine', check: () => true },
        { name: 'hangs', check: () => new Promise<boolean>(() => undefined) },
      ],
      routes: [],
      readinessTimeoutMs: 300,
    });
    const port = await s.listen(0, '127.0.0.1');
    try {
      const t0 = Date.now();
      // Before, the answer waited for the check: for good, with a Redis that no longer answers.
      const res = await fetch(`http://127.0.0.1:${port}/readyz`, { signal: AbortSignal.timeout(5_000) });
      expect(res.status).toBe(503);
      expect(await res.json()).toEqual({
        ready: false,
        checks: { fine: true, hangs: false },
        // A hang is told from a refusal.
        reasons: { hangs: 'no answer within 300 ms' },
      });
      expect(Date.now() - t0).toBeLessThan(2_000);
    } finally {
      await s.close();
    }
  });

  it('a check that says why it is not ready has its reason in the body, under `reasons`', async () => {
    let replica = true;
    const s = serverWith({
      readiness: [
        { name: 'fine', check: () => true },
        { name: 'redis', check: () => (replica ? { ready: false, reason: 'a read-only replica' } : true) },
      ],
      routes: [],
    });
    const port = await s.listen(0, '127.0.0.1');
    const get = async () => {
      const res = await fetch(`http://127.0.0.1:${port}/readyz`);
      return { status: res.status, body: (await res.json()) as unknown };
    };
    try {
      expect(await get()).toEqual({
        status: 503,
        body: {
          ready: false,
          checks: { fine: true, redis: false },
          reasons: { redis: 'a read-only replica' },
        },
      });
      replica = false;
      expect(await get()).toEqual({
        status: 200,
        body: { ready: true, checks: { fine: true, redis: true } },
      });
    } finally {
      await s.close();
    }
  });

  it('serves /healthz and /readyz before the service routes exist; other paths answer 503 until then', async () => {
    let started = false;
    const s = serverWith({
      readiness: [{ name: 'startup', check: () => started }],
    });
    const port = await s.listen(0, '127.0.0.1');
    const get = (p: string) => fetch(`http://127.0.0.1:${port}${p}`).then((r) => r.status);
    try {
      expect(await get('/healthz')).toBe(200);
      expect(await get('/readyz')).toBe(503);
      expect(await get('/things')).toBe(503);
      s.setRoutes([{ method: 'GET', path: '/things', handler: () => ({ status: 200, body: [] }) }]);
      started = true;
      expect(await get('/readyz')).toBe(200);
      expect(await get('/things')).toBe(200);
      expect(await get('/other')).toBe(404);
    } finally {
      await s.close();
    }
  });
});

describe('slow clients', () => {
  it('drops a client that sends its headers byte by byte (slowloris) after the headers timeout, and still closes at once', async () => {
    const s = serverWith({
      readiness: [],
    });
    const port = await s.listen(0, '127.0.0.1');
    const t0 = Date.now();
    const socket = connect(port, '127.0.0.1');
    socket.on('error', () => undefined);
    const dropped = new Promise<number>((r) => socket.once('close', () => r(Date.now() - t0)));
    const header = 'GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(200);
    let i = 0;
    const drip = setInterval(() => {
      if (!socket.destroyed && i < header.length) socket.write(header[i++]!);
    }, 200);
    // An idle keep-alive connection besides it must not hold the close up either.
    const idle = connect(port, '127.0.0.1');
    idle.on('error', () => undefined);
    try {
      // Before: Node's defaults, 60 s for the headers checked every 30 s.
      const ms = await Promise.race([dropped, new Promise<number>((r) => setTimeout(() => r(-1), 20_000))]);
      expect(ms).toBeGreaterThan(0);
      expect(ms).toBeLessThan(HEADERS_TIMEOUT_MS + 3_000);
      const c0 = Date.now();
      await s.close();
      expect(Date.now() - c0).toBeLessThan(1_000);
    } finally {
      clearInterval(drip);
      socket.destroy();
      idle.destroy();
    }
  }, 40_000);
});

describe('a dependency that does not answer', () => {
  it('answers 503 with Retry-After and a JSON error when a handler meets Redis down or the stop (not a 500), without the connection error', async () => {
    const s = serverWith({
      readiness: [],
      routes: [
        {
          method: 'GET',
          path: '/refused',
          handler: () => {
            throw Object.assign(new Error('connect ECONNREFUSED 10.0.0.7:6379'), { code: 'ECONNREFUSED' });
          },
        },
        {
          method: 'GET',
          path: '/timeout',
          handler: () => {
            throw new Error('Command timed out');
          },
        },
        {
          method: 'GET',
          path: '/stopping',
          handler: () => {
            throw new PaverError('SHUTTING_DOWN', 'redis state rebuild stopped: the service is stopping');
          },
        },
        {
          method: 'GET',
          path: '/bug',
          handler: () => {
            throw new TypeError('x is undefined');
          },
        },
      ],
    });
    const port = await s.listen(0, '127.0.0.1');
    const get = async (p: string) => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`);
      return {
        status: r.status,
        retryAfter: r.headers.get('retry-after'),
        body: (await r.json()) as unknown,
      };
    };
    try {
      for (const p of ['/refused', '/timeout'])
        expect(await get(p), p).toEqual({
          status: 503,
          retryAfter: '1',
          body: { error: 'Redis is unavailable, retry later' },
        });
      // A restore the stop gave up, which the request waited for: the instance is stopping, not broken.
      expect(await get('/stopping')).toEqual({
        status: 503,
        retryAfter: '1',
        body: { error: 'the service is stopping, retry later' },
      });
      expect(await get('/bug')).toEqual({ status: 500, retryAfter: null, body: { error: 'internal error' } });
    } finally {
      await s.close();
    }
  });
});

describe('methods', () => {
  it('answers 405 with an Allow header for a known path and a wrong method, HEAD like GET without a body, and serves every method a path has', async () => {
    const s = serverWith({
      readiness: [{ name: 'x', check: () => true }],
      routes: [
        { method: 'GET', path: '/things', handler: () => ({ status: 200, body: ['a'] }) },
        { method: 'POST', path: '/things', handler: () => ({ status: 201, body: { made: true } }) },
        { method: 'POST', path: '/things/:id/go', handler: () => ({ status: 200, body: {} }) },
      ],
    });
    const port = await s.listen(0, '127.0.0.1');
    const call = async (method: string, p: string) => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`, { method });
      return { status: r.status, allow: r.headers.get('allow'), text: await r.text() };
    };
    try {
      // Before: the first route of the path answered 405 for the method of the second one.
      expect(await call('POST', '/things')).toMatchObject({ status: 201, text: '{"made":true}' });
      expect(await call('GET', '/things')).toMatchObject({ status: 200, text: '["a"]' });
      expect(await call('DELETE', '/things')).toMatchObject({ status: 405, allow: 'GET, HEAD, POST' });
      expect(await call('GET', '/things/1/go')).toMatchObject({ status: 405, allow: 'POST' });
      expect(JSON.parse((await call('GET', '/things/1/go')).text)).toEqual({
        error: 'method not allowed (allowed: POST)',
      });
      // Before: 404 for the built-in endpoints, 405 for the routes.
      for (const p of ['/metrics', '/healthz', '/readyz', '/things'])
        expect(await call('HEAD', p), p).toMatchObject({ status: 200, text: '' });
      for (const p of ['/metrics', '/healthz', '/readyz'])
        expect(await call('POST', p), p).toMatchObject({ status: 405, allow: 'GET, HEAD' });
      expect(await call('GET', '/nowhere')).toMatchObject({ status: 404, allow: null });
    } finally {
      await s.close();
    }
  });
});

describe('query encoding', () => {
  it('refuses with 400 a query whose escapes are not UTF-8 (URLSearchParams would make them U+FFFD); valid escapes, literal % and non-ASCII pass', async () => {
    const s = serverWith({
      readiness: [],
      routes: [
        {
          method: 'GET',
          path: '/echo',
          handler: (req) => ({ status: 200, body: { t: req.query.get('tenant_id') } }),
        },
      ],
    });
    const port = await s.listen(0, '127.0.0.1');
    const get = async (q: string) => {
      const r = await fetch(`http://127.0.0.1:${port}/echo?${q}`);
      return { status: r.status, body: (await r.json()) as unknown };
    };
    try {
      // Before: 200 {"t":"a\ufffd"}, an answer for a tenant the client never named.
      for (const q of ['tenant_id=a%FF', 'tenant_id=%C3', 'x=%ED%A0%80&tenant_id=a'])
        expect(await get(q), q).toEqual({
          status: 400,
          body: { error: 'bad percent-encoding in the query (not UTF-8)' },
        });
      expect(await get('tenant_id=%C3%A9t%C3%A9')).toEqual({ status: 200, body: { t: 'été' } });
      expect(await get('tenant_id=100%')).toEqual({ status: 200, body: { t: '100%' } });
      expect(await get('tenant_id=a%2Gb')).toEqual({ status: 200, body: { t: 'a%2Gb' } });
      expect(await get('tenant_id=été')).toEqual({ status: 200, body: { t: 'été' } });
    } finally {
      await s.close();
    }
  });
});

describe('query parameters a route names', () => {
  it('refuses with 400 an unknown parameter (tenant= for tenant_id=) and one given twice; a route that names none keeps taking any', async () => {
    const s = serverWith({
      readiness: [],
      routes: [
        {
          method: 'GET',
          path: '/scoped',
          query: ['tenant_id', 'agent_id'],
          handler: (req) => ({ status: 200, body: { t: req.query.get('tenant_id') ?? 'default' } }),
        },
        { method: 'POST', path: '/none', query: [], handler: () => ({ status: 200, body: {} }) },
        { method: 'GET', path: '/open', handler: () => ({ status: 200, body: {} }) },
      ],
    });
    const port = await s.listen(0, '127.0.0.1');
    const call = async (p: string, method = 'GET') => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`, { method });
      return { status: r.status, body: (await r.json()) as unknown };
    };
    try {
      expect(await call('/scoped?tenant_id=acme&agent_id=bot')).toEqual({ status: 200, body: { t: 'acme' } });
      expect(await call('/scoped')).toEqual({ status: 200, body: { t: 'default' } });
      // Before: 200 {"t":"default"} (another tenant's answer) and 200 {"t":"a"} (the first of two).
      expect(await call('/scoped?tenant=acme')).toEqual({
        status: 400,
        body: { error: 'unknown query parameter "tenant" (takes tenant_id, agent_id)' },
      });
      expect(await call('/scoped?tenant_id=a&tenant_id=b')).toEqual({
        status: 400,
        body: { error: 'query parameter "tenant_id" given more than once' },
      });
      expect(await call('/none?tenant_id=acme', 'POST')).toEqual({
        status: 400,
        body: { error: 'unknown query parameter "tenant_id" (takes none)' },
      });
      expect((await call(`/scoped?${'x'.repeat(500)}=1`)).body).toEqual({
        error: `unknown query parameter "${'x'.repeat(64)}…" (takes tenant_id, agent_id)`,
      });
      expect((await call('/open?anything=1&anything=2')).status).toBe(200);
    } finally {
      await s.close();
    }
  });
});

describe('HTTP latency buckets', () => {
  it('reach the slow answers a service gives by design (a selection’s 3 s budget, a 5 s Redis deadline), so their quantiles are not capped at 2.5 s', async () => {
    const r = new Registry();
    createHttpServer({ registry: r, log: createLogger('test', 'silent'), readiness: [] });
    const h = r.getSingleMetric('paver_http_request_duration_seconds') as unknown as {
      observe: (l: Record<string, string>, v: number) => void;
    };
    for (const v of [3.1, 5.2]) h.observe({ method: 'POST', route: '/flows/select', status: '200' }, v);
    const m = parsePrometheus(await r.metrics());
    const bucket = (le: string) =>
      m.value('paver_http_request_duration_seconds_bucket', { route: '/flows/select', le });
    // Before: the last finite bucket was 2.5, both counted only in +Inf (histogram_quantile then says 2.5).
    expect([bucket('2.5'), bucket('5'), bucket('10'), bucket('+Inf')]).toEqual([0, 1, 2, 2]);
  });
});

describe('JSON request bodies', () => {
  /** A server whose POST /echo answers what `handler` makes of the body; `post` sends one request to it. */
  async function echoServer(
    handler: Route['handler'] = async (req) => ({ status: 200, body: await req.body() }),
  ) {
    const s = serverWith({ readiness: [], routes: [{ method: 'POST', path: '/echo', handler }] });
    const port = await s.listen(0, '127.0.0.1');
    const post = async (init: RequestInit) => {
      const res = await fetch(`http://127.0.0.1:${port}/echo`, { method: 'POST', ...init });
      return { status: res.status, body: (await res.json()) as unknown };
    };
    return { post, close: () => s.close() };
  }

  it('are refused with 415 when their Content-Type is not JSON; JSON with parameters, +json and none pass', async () => {
    const s = await echoServer();
    try {
      const post = (contentType: string | null) =>
        s.post({
          // A Blob without a type: fetch sends no Content-Type of its own.
          body: new Blob(['{"a":1}']),
          headers: contentType === null ? {} : { 'content-type': contentType },
        });
      // Before: each was parsed as JSON and answered 200.
      for (const t of [
        'text/plain',
        'text/plain;charset=UTF-8',
        'application/x-www-form-urlencoded',
        'application/xml',
      ])
        expect(await post(t), t).toEqual({
          status: 415,
          body: {
            error: `request body must be JSON (Content-Type: application/json), not ${t.split(';')[0]!.toLowerCase()}`,
          },
        });
      expect(await post('application/json; charset=utf-16')).toEqual({
        status: 415,
        body: { error: 'request body must be UTF-8 JSON, not charset utf-16' },
      });
      for (const t of [
        'application/json',
        'Application/JSON; charset="UTF-8"',
        'application/json;charset=utf-8',
        'application/merge-patch+json',
        'application/vnd.api+json; ext=x',
        null,
      ])
        expect(await post(t), String(t)).toEqual({ status: 200, body: { a: 1 } });
    } finally {
      await s.close();
    }
  });

  it('nested deeper than 256 levels are answered 400 (writing them back would overflow the stack), and the server goes on', async () => {
    const s = await echoServer();
    try {
      const post = (body: string) => s.post({ body, headers: { 'content-type': 'application/json' } });
      expect(await post('['.repeat(10_000) + ']'.repeat(10_000))).toEqual({
        status: 400,
        body: { error: 'request body nested deeper than 256 levels' },
      });
      expect(await post('{"a":[1]}')).toEqual({ status: 200, body: { a: [1] } });
    } finally {
      await s.close();
    }
  });

  it("a request with no content has no body, whatever its Content-Type says (curl -d '' sends a form type)", async () => {
    const s = await echoServer(async (req) => ({ status: 200, body: { got: (await req.body()) ?? null } }));
    try {
      const post = (headers: Record<string, string>, body?: string) => s.post({ headers, body });
      // Before: 415, as if an empty form were a body of the wrong type.
      for (const t of ['application/x-www-form-urlencoded', 'text/plain'])
        expect(await post({ 'content-type': t }, ''), t).toEqual({ status: 200, body: { got: null } });
      expect(await post({})).toEqual({ status: 200, body: { got: null } });
      // Content of the wrong type is still refused.
      expect((await post({ 'content-type': 'text/plain' }, '{}')).status).toBe(415);
    } finally {
      await s.close();
    }
  });
});
