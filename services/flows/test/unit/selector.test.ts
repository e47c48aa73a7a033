import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { flowDefinitionV1 } from '../../../../schemas/index.js';
import { select } from '../../src/adapters/selector.js';
import { selectCommand } from '../../src/cli.js';
import { PromptCache } from '../../src/core/prompt.js';
import { FlowRegistry, registerManual } from '../../src/core/registry.js';
import { DEFAULT_POLICY } from '../../src/core/select.js';

afterEach(() => {
  vi.restoreAllMocks();
  vi.unstubAllEnvs();
});

/** A stand-in embedder: text about a broken item lies near "replace", anything else near "refund". */
function stubEmbedder(embedded: string[] = []) {
  vi.spyOn(globalThis, 'fetch').mockImplementation(async (_url, init) => {
    const input = (JSON.parse(String(init!.body)) as { input: string[] }).input;
    embedded.push(...input);
    const data = input.map((t, index) => ({
      embedding: /broken|damaged/i.test(t) ? [0, 1] : [1, 0],
      index,
    }));
    return new Response(JSON.stringify({ data }), { status: 200 });
  });
  return embedded;
}

describe('dense recall and episode summaries (flow-selector.txt: contextual augmentation)', () => {
  it('embeds the query with the recent summaries, so a vague request is resolved by its context', async () => {
    const reg = new FlowRegistry();
    const refund = registerManual(
      flowDefinitionV1.parse({ name: 'refund', description: 'Refund an order' }),
      1,
    );
    const replace = registerManual(
      flowDefinitionV1.parse({ name: 'replace', description: 'Replace damaged goods' }),
      1,
    );
    reg.upsert(refund);
    reg.upsert(replace);
    reg.setVector('default', 'default', refund.id, [1, 0]);
    reg.setVector('default', 'default', replace.id, [0, 1]);
    const embedded = stubEmbedder();
    const sel = await select(
      {
        registry: reg,
        prompts: new PromptCache(),
        embeddings: { baseUrl: 'http://embed.invalid/', model: 'm' },
        budgetMs: 1000,
      },
      'default',
      'default',
      'I need help with that',
      ['User discussed a broken item in the previous episode.'],
      DEFAULT_POLICY,
    );
    expect(embedded).toEqual([
      'I need help with that\nUser discussed a broken item in the previous episode.',
    ]);
    expect(sel.chosen.map((c) => c.name)).toEqual(['replace']);
  });
});

describe('paver select, offline, recalls as the service does', () => {
  it('uses dense recall when FLOWS_EMBEDDINGS_URL is set', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-select-'));
    const file = join(dir, 'flows.json');
    writeFileSync(
      file,
      JSON.stringify([
        { name: 'refund', description: 'Refund an order' },
        { name: 'replace', description: 'Replace damaged goods' },
      ]),
    );
    vi.stubEnv('FLOWS_EMBEDDINGS_URL', 'http://embed.invalid/');
    vi.stubEnv('FLOWS_CHAT_URL', undefined);
    stubEmbedder();
    let out = '';
    vi.spyOn(process.stdout, 'write').mockImplementation((chunk) => {
      out += String(chunk);
      return true;
    });
    const code = await selectCommand([
      '--flows',
      file,
      '--query',
      'I need help with that',
      '--summary',
      'User discussed a broken item in the previous episode.',
    ]);
    expect(code).toBe(0);
    // No term of the request or the summary is in either flow: sparse recall alone recalls nothing.
    const result = JSON.parse(out) as { path: string; chosen: { name: string }[] };
    expect(result.chosen.map((c) => c.name)).toEqual(['replace']);
  });
});
