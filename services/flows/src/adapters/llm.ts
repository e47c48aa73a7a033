import { z } from 'zod';

/** OpenAI-compatible endpoints. Keys come from configuration; no key, prompt or answer is ever logged. */
export interface LlmConfig {
  baseUrl: string;
  apiKey?: string | undefined;
  model: string;
}

const chatReply = z.object({
  choices: z.array(z.object({ message: z.object({ content: z.string().nullable() }) })).min(1),
});
const embeddingsReply = z.object({
  data: z.array(z.object({ embedding: z.array(z.number()), index: z.number().int().optional() })).min(1),
});

/** A chat reply (one short answer) is far under this. */
export const MAX_CHAT_REPLY = 1024 * 1024;
/**
 * An embedding is JSON numbers, often one per indented line: about 35 KB for 1,536 dimensions, 70 KB for 3,072.
 * The bound grows with the inputs of the request, so a batch of 64 fits whatever the model.
 */
export const EMBEDDING_REPLY_PER_INPUT = 256 * 1024;

/** The body as text, read no further than `max` bytes: a model that answers without end costs at most that. */
async function readCapped(res: Response, max: number, path: string): Promise<string> {
  const tooLarge = () => new Error(`${path}: reply larger than ${max} bytes`);
  if (Number(res.headers.get('content-length') ?? 0) > max) {
    await res.body?.cancel().catch(() => undefined);
    throw tooLarge();
  }
  if (!res.body) return '';
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > max) {
      await reader.cancel().catch(() => undefined);
      throw tooLarge();
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function post(
  cfg: LlmConfig,
  path: string,
  body: unknown,
  signal: AbortSignal,
  maxReply: number,
): Promise<unknown> {
  const res = await fetch(new URL(path, cfg.baseUrl.endsWith('/') ? cfg.baseUrl : `${cfg.baseUrl}/`), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(cfg.apiKey ? { authorization: `Bearer ${cfg.apiKey}` } : {}),
    },
    body: JSON.stringify(body),
    signal,
  });
  // The status only: the body may echo the prompt.
  if (!res.ok) {
    await res.body?.cancel().catch(() => undefined);
    throw new Error(`${path}: HTTP ${res.status}`);
  }
  return JSON.parse(await readCapped(res, maxReply, path));
}

export async function chat(
  cfg: LlmConfig,
  system: string,
  user: string,
  signal: AbortSignal,
): Promise<string> {
  const r = chatReply.safeParse(
    await post(
      cfg,
      'chat/completions',
      {
        model: cfg.model,
        temperature: 0,
        messages: [
          { role: 'system', content: system },
          { role: 'user', content: user },
        ],
      },
      signal,
      MAX_CHAT_REPLY,
    ),
  );
  if (!r.success) throw new Error('chat/completions: unexpected reply shape');
  return r.data.choices[0]!.message.content ?? '';
}

export async function embed(cfg: LlmConfig, inputs: string[], signal: AbortSignal): Promise<number[][]> {
  const r = embeddingsReply.safeParse(
    await post(
      cfg,
      'embeddings',
      { model: cfg.model, input: inputs },
      signal,
      MAX_CHAT_REPLY + inputs.length * EMBEDDING_REPLY_PER_INPUT,
    ),
  );
  if (!r.success || r.data.data.length !== inputs.length)
    throw new Error('embeddings: unexpected reply shape');
  return [...r.data.data].sort((a, b) => (a.index ?? 0) - (b.index ?? 0)).map((d) => d.embedding);
}
