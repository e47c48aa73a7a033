import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/** What the double answers to one chat request; `delayMs` makes it slow, `status` makes it fail. */
export interface ChatReply {
  content?: string;
  raw?: string;
  status?: number;
  delayMs?: number;
}

/**
 * A small OpenAI-format server for tests: /v1/chat/completions answers with whatever `chat` returns for the
 * request (well-formed, malformed, slow or failing), /v1/embeddings with a bag-of-words vector. No test calls
 * the internet.
 */
export async function startLlmDouble(
  chat: (body: { messages: { role: string; content: string }[] }) => ChatReply,
) {
  const requests: { path: string; body: unknown; auth: string | undefined }[] = [];
  // Answers not yet sent (a slow reply): cleared at close, so a reply meant never to come does not keep a timer.
  const pending = new Set<NodeJS.Timeout>();
  const server: Server = createServer((req, res) => {
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString()));
    req.on('end', () => {
      const body = JSON.parse(text || '{}');
      requests.push({ path: req.url ?? '', body, auth: req.headers.authorization });
      const send = (status: number, payload: string) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(payload);
      };
      if (req.url === '/v1/embeddings') {
        const vec = (s: string) =>
          Array.from(
            { length: 16 },
            (_, i) => [...s.toLowerCase()].filter((ch) => ch.charCodeAt(0) % 16 === i).length,
          );
        const inputs: string[] = Array.isArray(body.input) ? body.input : [body.input];
        return send(200, JSON.stringify({ data: inputs.map((s, index) => ({ index, embedding: vec(s) })) }));
      }
      if (req.url !== '/v1/chat/completions') return send(404, '{}');
      const r = chat(body);
      const timer = setTimeout(() => {
        pending.delete(timer);
        if (r.status && r.status >= 400) return send(r.status, '{"error":"boom"}');
        send(
          200,
          r.raw ??
            JSON.stringify({ choices: [{ message: { role: 'assistant', content: r.content ?? '' } }] }),
        );
      }, r.delayMs ?? 0);
      pending.add(timer);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    requests,
    close: () =>
      new Promise<void>((r) => {
        for (const t of pending) clearTimeout(t);
        pending.clear();
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
