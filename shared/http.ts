import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Histogram, type Registry } from 'prom-client';
import type { Logger } from './log.js';
import { classifyError, errorMessage } from './errors.js';
import { deeperThan, TOO_DEEP } from './core/json-depth.js';

export interface HttpRequest {
  method: string;
  path: string;
  params: Record<string, string>;
  query: URLSearchParams;
  body: () => Promise<unknown>;
}
export interface HttpResponse {
  status: number;
  body: unknown;
  contentType?: string;
  /**
   * The body already serialized as JSON (sent as is, with the JSON content type; `body` is then ignored): a route
   * that answers from memoized parts skips serializing the same object on every request.
   */
  json?: string;
}
export type Handler = (req: HttpRequest) => Promise<HttpResponse> | HttpResponse;
export interface Route {
  method: 'GET' | 'POST';
  /** Path with `:name` segments, e.g. `/sessions/:session_id/allowed-tools`. */
  path: string;
  /**
   * The query parameters the route takes. Given, any other (a `tenant=` meant as `tenant_id=`, which would answer
   * for the default tenant) or one given twice (which one counts?) is refused with 400.
   */
  query?: readonly string[];
  handler: Handler;
}
/** Ready or not; a check that knows why it is not ready says so, and /readyz shows it under `reasons`. */
export type ReadinessResult = boolean | { ready: boolean; reason?: string };
export interface ReadinessCheck {
  name: string;
  check: () => Promise<ReadinessResult> | ReadinessResult;
}

const MAX_BODY = 1024 * 1024;
/** Time a client has to send a request's headers, and its whole request (a body is at most MAX_BODY). */
export const HEADERS_TIMEOUT_MS = 10_000;
const REQUEST_TIMEOUT_MS = 30_000;
/**
 * How long one readiness check may take before it counts as failed. A dependency that hangs (a frozen Redis, a
 * network partition that drops packets rather than refusing them) must make /readyz answer "not ready", not hang
 * it: under Kubernetes's default probe timeout (1 s), so the probe and a person with curl both get an answer.
 */
export const READINESS_CHECK_TIMEOUT_MS = 800;

/** `check` within `ms`, else not ready, saying so (a hang is worth telling from a refusal); a throw is false. */
async function bounded(
  check: ReadinessCheck['check'],
  ms: number,
): Promise<{ ready: boolean; reason?: string }> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const r = await Promise.race([
      Promise.resolve()
        .then(check)
        .catch(() => false),
      new Promise<ReadinessResult>(
        (r) => (timer = setTimeout(() => r({ ready: false, reason: `no answer within ${ms} ms` }), ms)),
      ),
    ]);
    return typeof r === 'boolean' ? { ready: r } : r;
  } finally {
    clearTimeout(timer);
  }
}
const HTTP_METRIC = 'paver_http_request_duration_seconds';

/** One histogram per registry: a service may build more than one server on the same registry. */
function requestHistogram(registry: Registry): Histogram<'method' | 'route' | 'status'> {
  const existing = registry.getSingleMetric(HTTP_METRIC);
  if (existing) return existing as Histogram<'method' | 'route' | 'status'>;
  return new Histogram({
    // A literal, not HTTP_METRIC: the dashboard test finds metric names by reading `name:` literals.
    name: 'paver_http_request_duration_seconds',
    help: 'HTTP request latency by method, route pattern (never the raw path) and status code.',
    labelNames: ['method', 'route', 'status'],
    // Fine below 2.5 ms: an in-process read is a few hundred µs, and its p99 target (1 ms) must be readable.
    // Up to 10 s: a selection may take its whole budget (FLOWS_SELECT_BUDGET_MS, 3 s by default) and a request
    // that meets a frozen Redis its command deadline (REDIS_COMMAND_TIMEOUT_MS, 5 s); above the last finite
    // bucket, histogram_quantile answers that bucket's bound (2.5 s), whatever the real time.
    buckets: [
      0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
      0.5, 1, 2.5, 5, 10,
    ],
    registers: [registry],
  });
}

function compile(path: string): { re: RegExp; names: string[] } {
  const names: string[] = [];
  const re = path.replace(/:([a-zA-Z_]+)/g, (_m, n: string) => {
    names.push(n);
    return '([^/]+)';
  });
  return { re: new RegExp(`^${re}$`), names };
}

// What URL parsing leaves as it is: a path of unreserved characters, sub-delimiters, ':', '@', '%' and '/' (not
// '//': that would be a host), with no dot segment, and a query of printable ASCII without '#'. Such a target is
// split by hand (a URL object costs a few µs and a kilobyte on every request); any other goes through URL.
const PLAIN_PATH = /^\/(?!\/)[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*$/;
const DOT_SEGMENT = /\/(\.|%2e)/i;
// (URLSearchParams drops a leading '?' of its input, so a query starting with one is not plain.)
const PLAIN_QUERY = /^(?!\?)[\x21\x22\x24-\x7e]*$/;

/** The request target's path and query, exactly as `new URL(target, 'http://localhost')` would give them. */
export function parseTarget(target: string): { pathname: string; query: URLSearchParams } {
  const q = target.indexOf('?');
  const path = q < 0 ? target : target.slice(0, q);
  const query = q < 0 ? '' : target.slice(q + 1);
  if (PLAIN_PATH.test(path) && !DOT_SEGMENT.test(path) && PLAIN_QUERY.test(query))
    return { pathname: path, query: new URLSearchParams(query) };
  let url: URL;
  try {
    url = new URL(target, 'http://localhost');
  } catch {
    throw Object.assign(new Error('bad request target'), { status: 400 });
  }
  return { pathname: url.pathname, query: url.searchParams };
}

/**
 * A query whose escapes do not spell UTF-8 (`tenant_id=%FF`): URLSearchParams turns them into U+FFFD, so the
 * route would answer for a name the client never sent. A '%' not followed by two hex digits stays literal, as
 * URLSearchParams keeps it.
 */
function queryBadUtf8(target: string): boolean {
  const q = target.indexOf('?');
  if (q < 0 || !target.includes('%', q)) return false;
  try {
    decodeURIComponent(target.slice(q + 1).replace(/%(?![0-9a-fA-F]{2})/g, '%25'));
    return false;
  } catch {
    return true;
  }
}

/** Why a query does not fit the parameters a route takes (unknown, or given twice); null when it fits. */
function badQuery(query: URLSearchParams, takes: readonly string[]): string | null {
  const seen = new Set<string>();
  // Named in the answer only when refused: this runs on every request of the allowed-tools hot path.
  const shown = (name: string) => JSON.stringify(name.length > 64 ? `${name.slice(0, 64)}…` : name);
  for (const name of query.keys()) {
    if (!takes.includes(name))
      return `unknown query parameter ${shown(name)} (${takes.length ? `takes ${takes.join(', ')}` : 'takes none'})`;
    if (seen.has(name)) return `query parameter ${shown(name)} given more than once`;
    seen.add(name);
  }
  return null;
}

/** A path parameter, percent-decoded; a bad escape is the client's error. */
function decodeParam(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw Object.assign(new Error('bad percent-encoding in the path'), { status: 400 });
  }
}

/**
 * Why a request's Content-Type is not JSON's, or null: `application/json` or `application/<x>+json`, with any
 * parameters but a charset other than UTF-8 (JSON's only encoding, and the only one decoded). No Content-Type is
 * taken as JSON. Parsed whatever its type, a form post (`curl -d` sends application/x-www-form-urlencoded) that
 * happened to parse would be answered as if it were JSON.
 */
function notJson(contentType: string | undefined): string | null {
  if (contentType === undefined) return null;
  const [type = '', ...params] = contentType.split(';');
  const media = type.trim().toLowerCase();
  if (media !== 'application/json' && !/^application\/[!#$&^_.+\w-]+\+json$/.test(media))
    return `request body must be JSON (Content-Type: application/json), not ${media.slice(0, 100) || 'an empty type'}`;
  for (const p of params) {
    const [name = '', value = ''] = p.split('=');
    if (name.trim().toLowerCase() !== 'charset') continue;
    const charset = value
      .trim()
      .replace(/^"(.*)"$/, '$1')
      .toLowerCase();
    if (charset !== 'utf-8' && charset !== 'utf8')
      return `request body must be UTF-8 JSON, not charset ${charset.slice(0, 40)}`;
  }
  return null;
}

/**
 * Whether a request carries content: a Content-Length over 0, or a chunked Transfer-Encoding (a request with
 * neither has none). `curl -d ''` sends an empty form: its Content-Type describes nothing, and is not refused.
 */
function hasContent(req: IncomingMessage): boolean {
  const length = req.headers['content-length'];
  if (length !== undefined) return length.trim() !== '0';
  return req.headers['transfer-encoding'] !== undefined;
}

async function readBody(req: IncomingMessage): Promise<unknown> {
  if (!hasContent(req)) return undefined;
  // Before a byte is read: the type decides whether the body is read at all.
  const why = notJson(req.headers['content-type']);
  if (why) throw Object.assign(new Error(why), { status: 415 });
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY) throw Object.assign(new Error('request body too large'), { status: 413 });
    chunks.push(chunk as Buffer);
  }
  if (size === 0) return undefined;
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    throw Object.assign(new Error('request body is not valid JSON'), { status: 400 });
  }
  if (deeperThan(body)) throw Object.assign(new Error(`request body ${TOO_DEEP}`), { status: 400 });
  return body;
}

/**
 * The per-service HTTP server: `/metrics`, `/healthz` (process up), `/readyz` (every readiness check
 * passes) and the service's own routes. node:http is enough for a handful of JSON routes.
 */
export function createHttpServer(opts: {
  registry: Registry;
  /** Read on every request: a caller may add checks to the array later (once start-up has built them). */
  readiness: ReadinessCheck[];
  /** The service's own routes; left out, other paths answer 503 until `setRoutes` gives them. */
  routes?: Route[];
  log: Logger;
  /** Per check; defaults to READINESS_CHECK_TIMEOUT_MS. */
  readinessTimeoutMs?: number;
}): {
  server: Server;
  listen: (port: number, host: string) => Promise<number>;
  close: () => Promise<void>;
  /**
   * The service's own routes, once start-up has built them. Until then any other path answers 503: the server
   * listens from the first moment so that /healthz does not wait for Kafka, Redis or a table.
   */
  setRoutes: (routes: Route[]) => void;
} {
  const compileAll = (rs: Route[]) => rs.map((r) => ({ ...r, ...compile(r.path) }));
  let routes: ReturnType<typeof compileAll> | null = opts.routes ? compileAll(opts.routes) : null;
  const checkTimeout = opts.readinessTimeoutMs ?? READINESS_CHECK_TIMEOUT_MS;
  const send = (
    res: ServerResponse,
    status: number,
    body: unknown,
    contentType = 'application/json',
    serialized = false,
  ) => {
    const text = contentType === 'application/json' && !serialized ? JSON.stringify(body) : String(body);
    res.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(text) });
    res.end(text);
  };

  /** 405 with the `Allow` header RFC 9110 requires: the path's methods (HEAD wherever GET is). */
  const notAllowed = (res: ServerResponse, methods: string[]) => {
    const all = new Set(methods.flatMap((m) => (m === 'GET' ? ['GET', 'HEAD'] : [m])));
    res.setHeader('allow', [...all].sort().join(', '));
    return send(res, 405, { error: `method not allowed (allowed: ${[...all].sort().join(', ')})` });
  };

  const latency = requestHistogram(opts.registry);
  const KNOWN_METHODS = new Set(['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS']);

  const server = createServer(
    {
      // A client that sends its headers byte by byte (slowloris) holds a socket, a file descriptor the process's
      // Kafka and Redis connections share, for as long as the server lets it: Node's defaults are 60 s for the
      // headers, checked every 30 s. Probes and scrapes send theirs at once.
      headersTimeout: HEADERS_TIMEOUT_MS,
      requestTimeout: REQUEST_TIMEOUT_MS,
      connectionsCheckingInterval: 1_000,
    },
    (req, res) => {
      const started = process.hrtime.bigint();
      const method = req.method ?? 'GET';
      // HEAD is a GET without its body (node:http leaves the body out of a HEAD response, headers included).
      const asGet = method === 'HEAD' ? 'GET' : method;
      // The route's pattern, not its path: session ids in a label would be unbounded cardinality.
      let route = 'unmatched';
      res.once('finish', () => {
        latency.observe(
          { method: KNOWN_METHODS.has(method) ? method : 'other', route, status: String(res.statusCode) },
          Number(process.hrtime.bigint() - started) / 1e9,
        );
      });
      void (async () => {
        // A target no URL parser takes (`GET http://[/x`), or a bad escape in a path parameter, is the client's
        // error: a 400, never an exception out of this handler (which would end the process).
        let url: ReturnType<typeof parseTarget> = { pathname: '', query: new URLSearchParams() };
        try {
          url = parseTarget(req.url ?? '/');
          if (url.pathname === '/metrics' || url.pathname === '/healthz' || url.pathname === '/readyz') {
            route = url.pathname;
            if (asGet !== 'GET') return notAllowed(res, ['GET']);
          }
          if (url.pathname === '/metrics') {
            return send(res, 200, await opts.registry.metrics(), opts.registry.contentType);
          }
          if (url.pathname === '/healthz') return send(res, 200, { status: 'ok' });
          if (url.pathname === '/readyz') {
            const results = await Promise.all(
              opts.readiness.map(async (c) => [c.name, await bounded(c.check, checkTimeout)] as const),
            );
            const ready = results.every(([, r]) => r.ready);
            const reasons = results.filter(([, r]) => !r.ready && r.reason).map(([n, r]) => [n, r.reason]);
            return send(res, ready ? 200 : 503, {
              ready,
              checks: Object.fromEntries(results.map(([n, r]) => [n, r.ready])),
              ...(reasons.length ? { reasons: Object.fromEntries(reasons) } : {}),
            });
          }
          if (!routes) return send(res, 503, { error: 'starting' });
          // Every route of the path is looked at: one path may take GET and POST, each its own route.
          const allowed: string[] = [];
          for (const r of routes) {
            const m = r.re.exec(url.pathname);
            if (!m) continue;
            route = r.path;
            if (r.method !== asGet) {
              allowed.push(r.method);
              continue;
            }
            // A browser sends Origin with a request another site's page makes; curl, the CLI and services do
            // not. The API has no cookies or CORS, but a page can still POST (promote a flow) to a port it can
            // reach (localhost, a cluster address): such a request is refused before its handler runs.
            if (asGet !== 'GET' && req.headers.origin !== undefined)
              return send(res, 403, { error: 'requests from web pages are refused (Origin header)' });
            if (queryBadUtf8(req.url ?? ''))
              return send(res, 400, { error: 'bad percent-encoding in the query (not UTF-8)' });
            if (r.query) {
              const bad = badQuery(url.query, r.query);
              if (bad) return send(res, 400, { error: bad });
            }
            const params: Record<string, string> = {};
            r.names.forEach((n, i) => (params[n] = decodeParam(m[i + 1] ?? '')));
            const out = await r.handler({
              method,
              path: url.pathname,
              params,
              query: url.query,
              body: () => readBody(req),
            });
            if (out.json !== undefined) return send(res, out.status, out.json, 'application/json', true);
            return send(res, out.status, out.body, out.contentType);
          }
          if (allowed.length > 0) return notAllowed(res, allowed);
          return send(res, 404, { error: 'not found' });
        } catch (err) {
          const status = (err as { status?: number }).status;
          if (status === undefined) {
            // Redis (or Kafka) not answering is not the service's bug: 503, which a client retries, not a 500.
            // The connection error itself stays in the log.
            const e = classifyError(err);
            // A request that waited for work the stop gave up (a restore of Redis after a loss): this instance
            // is going away, not broken; another one (or this one's successor) answers the retry.
            if (e.code === 'SHUTTING_DOWN') {
              res.setHeader('retry-after', '1');
              return send(res, 503, { error: 'the service is stopping, retry later' });
            }
            if (e.retriable) {
              opts.log.warn(
                { err: e.message, code: e.code, path: url.pathname },
                'http handler: dependency unavailable',
              );
              res.setHeader('retry-after', '1');
              return send(res, 503, {
                error:
                  e.code === 'REDIS_UNAVAILABLE'
                    ? 'Redis is unavailable, retry later'
                    : 'temporarily unavailable, retry later',
              });
            }
          }
          if (status === undefined || status >= 500)
            opts.log.error({ err: errorMessage(err), path: url.pathname }, 'http handler failed');
          return send(res, status ?? 500, {
            error: status === undefined || status >= 500 ? 'internal error' : errorMessage(err),
          });
        }
      })();
    },
  );
  server.keepAliveTimeout = 5_000;

  return {
    server,
    listen: (port, host) =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => resolve((server.address() as AddressInfo).port));
      }),
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
    setRoutes: (rs) => {
      routes = compileAll(rs);
    },
  };
}
