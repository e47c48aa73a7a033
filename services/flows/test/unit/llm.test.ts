import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { chat, embed, MAX_CHAT_REPLY } from '../../src/adapters/llm.js';

// A local HTTP server in the model's place: the adapter's own reading of replies is what is under test.
const servers: Server[] = [];
async function serve(handler: (req: IncomingMessage, res: ServerResponse) => void) {
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      (req as IncomingMessage & { body?: string }).body = body;
      handler(req, res);
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, model: 'm' };
}

afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

describe('model adapter replies', () => {
  it('takes a batch of 64 embeddings of 1,536 dimensions, indented as OpenAI sends them (over 1 MiB)', async () => {
    const cfg = await serve((req, res) => {
      const inputs = JSON.parse((req as IncomingMessage & { body: string }).body).input as string[];
      const data = inputs.map((_, index) => ({
        object: 'embedding',
        index,
        embedding: Array.from({ length: 1536 }, (_, d) => -0.0123456789 + d * 1e-7),
      }));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data, model: 'm' }, null, 2));
    });
    const inputs = Array.from({ length: 64 }, (_, i) => `flow ${i}`);
    // Before: "embeddings: reply larger than 1048576 bytes" for every batch over about 30 flows, so a registry of
    // more than that never got its vectors.
    const vs = await embed(cfg, inputs, AbortSignal.timeout(30_000));
    expect(vs).toHaveLength(64);
    expect(vs[0]).toHaveLength(1536);
  });

  it('stops reading a reply without end at the bound, rather than holding it all', async () => {
    let written = 0;
    const cfg = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const chunk = Buffer.alloc(64 * 1024, 0x20);
      const more = () => {
        while (!res.destroyed && written < 1024 * 1024 * 1024) {
          written += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', more);
        }
      };
      more();
    });
    // Before: read until the signal ended the call, whatever the size (here an AbortError, not a size error).
    await expect(chat(cfg, 'system', 'user', AbortSignal.timeout(30_000))).rejects.toThrow(
      `chat/completions: reply larger than ${MAX_CHAT_REPLY} bytes`,
    );
    expect(written).toBeLessThan(64 * MAX_CHAT_REPLY);
  });

  it('refuses a reply whose declared length is over the bound without reading it', async () => {
    const cfg = await serve((_req, res) => {
      res.writeHead(200, {
        'content-type': 'application/json',
        'content-length': String(MAX_CHAT_REPLY + 1),
      });
      res.write('{');
    });
    await expect(chat(cfg, 'system', 'user', AbortSignal.timeout(30_000))).rejects.toThrow(
      'reply larger than',
    );
  });

  it('names the status of a failed reply, never its body', async () => {
    const cfg = await serve((_req, res) => {
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end('{"error":"the prompt was: secret"}');
    });
    const err = await chat(cfg, 'system', 'user', AbortSignal.timeout(30_000)).catch((e: Error) => e);
    expect(String(err)).toContain('chat/completions: HTTP 500');
    expect(String(err)).not.toContain('secret');
  });
});
