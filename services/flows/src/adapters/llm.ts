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

const MAX_REPLY = 1024 * 1024;

async function post(cfg: LlmConfig, path: string, body: unknown, signal: AbortSignal): Promise<unknown> {
  const res = await fetch(new URL(path, cfg.baseUrl.endsWith('/') ? cfg.baseUrl : `${cfg.baseUrl}/`), {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(cfg.apiKey ? { authorization: `Bearer ${cfg.apiKey}` } : {}),
    },
    body: JSON.stringify(body),
    signal,
  });
  const text = await res.text();
  if (text.length > MAX_REPLY) throw new Error(`${path}: reply larger than ${MAX_REPLY} bytes`);
  // The status only: the body may echo the prompt.
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
  return JSON.parse(text);
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
    ),
  );
  if (!r.success) throw new Error('chat/completions: unexpected reply shape');
  return r.data.choices[0]!.message.content ?? '';
}

export async function embed(cfg: LlmConfig, inputs: string[], signal: AbortSignal): Promise<number[][]> {
  const r = embeddingsReply.safeParse(
    await post(cfg, 'embeddings', { model: cfg.model, input: inputs }, signal),
  );
  if (!r.success || r.data.data.length !== inputs.length)
    throw new Error('embeddings: unexpected reply shape');
  return [...r.data.data].sort((a, b) => (a.index ?? 0) - (b.index ?? 0)).map((d) => d.embedding);
}
