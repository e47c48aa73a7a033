import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A small Confluent Schema Registry double (in memory), serving the endpoints the client uses. No
 * Confluent-compatible server can be installed on the build machines, so the codec path is tested here.
 */
export async function startRegistryDouble(): Promise<{
  url: string;
  close: () => Promise<void>;
  schemas: Map<number, { schema: string; schemaType: string }>;
  /** While down, every request is answered 503, as a registry down for maintenance behind its proxy. */
  setDown: (down: boolean) => void;
  /** Requests answered 503 so far. */
  refused: () => number;
}> {
  let down = false;
  let refused = 0;
  const schemas = new Map<number, { schema: string; schemaType: string }>();
  const subjects = new Map<string, number[]>();
  const config = new Map<string, string>();
  const send = (res: ServerResponse, status: number, body: unknown) => {
    res.writeHead(status, { 'content-type': 'application/vnd.schemaregistry.v1+json' });
    res.end(JSON.stringify(body));
  };
  const server: Server = createServer((req, res) => {
    let raw = '';
    req.on('data', (d) => (raw += d));
    req.on('end', () => {
      if (down) {
        refused++;
        return send(res, 503, { error_code: 50301, message: 'Service Unavailable' });
      }
      const url = new URL(req.url ?? '/', 'http://x');
      const parts = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
      const body = raw
        ? (JSON.parse(raw) as { schema: string; schemaType?: string; compatibility?: string })
        : undefined;
      if (parts[0] === 'config' && !parts[1] && req.method === 'GET')
        return send(res, 200, { compatibilityLevel: 'BACKWARD' });
      if (parts[0] === 'config' && parts[1]) {
        if (req.method === 'PUT') {
          config.set(parts[1], body!.compatibility!);
          return send(res, 200, { compatibility: body!.compatibility });
        }
        const c = config.get(parts[1]);
        return c
          ? send(res, 200, { compatibilityLevel: c })
          : send(res, 404, { error_code: 40408, message: 'Subject not found' });
      }
      if (parts[0] === 'subjects' && parts[1] && parts[2] === 'versions' && req.method === 'POST') {
        let id = [...schemas].find(([, s]) => s.schema === body!.schema)?.[0];
        if (id === undefined) {
          id = schemas.size + 1;
          schemas.set(id, { schema: body!.schema, schemaType: body!.schemaType ?? 'AVRO' });
        }
        const list = subjects.get(parts[1]) ?? [];
        if (!list.includes(id)) list.push(id);
        subjects.set(parts[1], list);
        return send(res, 200, { id });
      }
      if (parts[0] === 'subjects' && parts[1] && parts[2] === 'versions' && parts[3]) {
        const list = subjects.get(parts[1]);
        const id = list?.[parts[3] === 'latest' ? list.length - 1 : Number(parts[3]) - 1];
        return id
          ? send(res, 200, { subject: parts[1], id, version: list!.indexOf(id) + 1, ...schemas.get(id) })
          : send(res, 404, { error_code: 40401, message: 'Subject not found' });
      }
      if (parts[0] === 'schemas' && parts[1] === 'ids' && parts[2]) {
        const s = schemas.get(Number(parts[2]));
        return s ? send(res, 200, s) : send(res, 404, { error_code: 40403, message: 'Schema not found' });
      }
      return send(res, 404, { error_code: 404, message: 'not found' });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    schemas,
    setDown: (d) => (down = d),
    refused: () => refused,
    close: () => new Promise((r) => server.close(() => r())),
  };
}
