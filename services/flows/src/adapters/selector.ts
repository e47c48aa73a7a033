import type { FlowRegistry } from '../core/registry.js';
import {
  augment,
  choose,
  needsModel,
  recall,
  type ModelOutcome,
  type Selection,
  type SelectPolicy,
} from '../core/select.js';
import { SYSTEM_PROMPT, userPrompt, type PromptCache } from '../core/prompt.js';
import { chat, embed, type LlmConfig } from './llm.js';
import type { OutcomeBook } from '../core/outcomes.js';
import { PaverError } from '../../../../shared/errors.js';

export interface SelectorDeps {
  registry: FlowRegistry;
  prompts: PromptCache;
  chat?: LlmConfig | undefined;
  embeddings?: LlmConfig | undefined;
  /** Bounds the whole selection (query embedding + model call). */
  budgetMs: number;
  onModel?: (outcome: 'answer' | 'error' | 'timeout') => void;
  /** Past outcomes per scope; without it, selection is sparse + dense + model only. */
  outcomes?: OutcomeBook | undefined;
}

/**
 * The two stages with their I/O: query embedding (optional), recall, then the model within the time budget.
 * `stop` (a consumer batch's signal) ends a model call or an embedding in flight: the selection is then not made
 * (SHUTTING_DOWN), rather than made without the model, since its record is read again by whoever reads on.
 */
export async function select(
  d: SelectorDeps,
  tenant: string,
  agent: string,
  query: string,
  summaries: string[],
  p: SelectPolicy,
  stop?: AbortSignal,
): Promise<Selection> {
  const stopped = () => {
    if (stop?.aborted)
      throw new PaverError('SHUTTING_DOWN', 'flow selection stopped: the batch stops or its partition moved');
  };
  stopped();
  const budget = AbortSignal.timeout(d.budgetMs);
  const deadline = stop ? AbortSignal.any([budget, stop]) : budget;
  let vector: number[] | null = null;
  if (d.embeddings && d.registry.index(tenant, agent)?.vectors.size) {
    // Dense recall is a bonus: a failing embedder leaves sparse recall alone. It embeds the query with the recent
    // episode summaries, as sparse recall searches it (flow-selector.txt: retrieval appends them, so "help me with
    // that" finds what "that" was); the query alone lost them in the dense ranking.
    const text = augment(query, summaries, p.maxSummaries);
    vector = (await embed(d.embeddings, [text], deadline).catch(() => null))?.[0] ?? null;
    stopped();
  }
  const cands = recall(
    d.registry,
    tenant,
    agent,
    query,
    summaries,
    p,
    vector,
    d.outcomes?.scorer(tenant, agent, query),
  );
  let model: ModelOutcome = { kind: 'none' };
  if (d.chat && needsModel(cands, p)) {
    try {
      const text = await chat(
        d.chat,
        SYSTEM_PROMPT,
        userPrompt(
          query,
          summaries.slice(-p.maxSummaries),
          cands.map((c) => c.flow),
        ),
        deadline,
      );
      model = { kind: 'answer', text };
      d.onModel?.('answer');
    } catch (err) {
      // Cut short by the stop, not failed: no fallback choice is published for it.
      stopped();
      model = { kind: 'failed' };
      d.onModel?.(
        (err instanceof Error ? err.name : '') === 'TimeoutError' || budget.aborted ? 'timeout' : 'error',
      );
    }
  }
  return choose(cands, model, p, d.prompts);
}

/** Computes the vectors the registry lacks, in batches; failures are retried on the next call. */
export async function fillVectors(
  registry: FlowRegistry,
  cfg: LlmConfig,
  timeoutMs: number,
): Promise<number> {
  const { searchText } = await import('../core/registry.js');
  const missing = registry.missingVectors();
  let done = 0;
  for (let i = 0; i < missing.length; i += 64) {
    const batch = missing.slice(i, i + 64);
    const vs = await embed(cfg, batch.map(searchText), AbortSignal.timeout(timeoutMs));
    batch.forEach((f, j) => registry.setVector(f.tenant_id, f.agent_id, f.id, vs[j]!));
    done += batch.length;
  }
  return done;
}
