// In-process use of the services' pure cores: the same code the services and the offline CLI run, with
// no Kafka, Redis or network. Only services' core/ modules are imported here, never their adapters.
import {
  flowDefinitionV1,
  toolCallsEventV1,
  type FlowCandidate,
  type FlowDefinition,
} from '../schemas/index.js';
import { PaverError } from '../shared/errors.js';
import { liveCandidates } from '../services/detector/src/core/detect.js';
import { toOp } from '../services/detector/src/core/ops.js';
import { DEFAULT_PARAMS, validateParams, type DetectorParams } from '../services/detector/src/core/params.js';
import { DetectorState } from '../services/detector/src/core/state.js';
import { PromptCache } from '../services/flows/src/core/prompt.js';
import { FlowRegistry, registerManual } from '../services/flows/src/core/registry.js';
import {
  DEFAULT_POLICY,
  choose,
  recall,
  type Selection,
  type SelectPolicy,
} from '../services/flows/src/core/select.js';

export type { DetectorParams, SelectPolicy, Selection };
export { DEFAULT_PARAMS as DEFAULT_DETECTOR_PARAMS, DEFAULT_POLICY as DEFAULT_SELECT_POLICY };

export interface ScopeCandidates {
  tenant_id: string;
  agent_id: string;
  candidates: FlowCandidate[];
}
export interface DetectResult {
  scopes: ScopeCandidates[];
  /** Events that failed the tool-calls contract (skipped, like the services dead-letter them). */
  invalid: number;
}

/**
 * The detector over events in the given order, in memory: the flow candidates of every (tenant, agent)
 * scope at the end. Events are validated with the tool-calls contract; invalid ones are counted, skipped.
 */
export function detect(events: Iterable<unknown>, params: Partial<DetectorParams> = {}): DetectResult {
  const p: DetectorParams = { ...DEFAULT_PARAMS, ...params };
  const errs = validateParams(p);
  if (errs.length) throw new PaverError('CONFIG_INVALID', `detector parameters: ${errs.join('; ')}`);
  const state = new DetectorState(p);
  let invalid = 0;
  for (const raw of events) {
    const parsed = toolCallsEventV1.safeParse(raw);
    if (!parsed.success) {
      invalid++;
      continue;
    }
    const op = toOp(parsed.data, p.requestTerms);
    if (op) state.apply(op);
  }
  return {
    scopes: state.scopesSeen().map((s) => ({
      tenant_id: s.tenant,
      agent_id: s.agent,
      // The window's records too: a candidate's request terms come from the records that contain it.
      candidates: liveCandidates(state.frequentStats(s), p, state.windowRecords(s)),
    })),
    invalid,
  };
}

export interface SelectOptions {
  summaries?: string[];
  policy?: Partial<SelectPolicy>;
}

/**
 * Flow selection without a model: recall (BM25 + RRF) over the given flow definitions, then the
 * deterministic choice the flows service makes when no chat model is configured.
 */
export function select(flows: readonly unknown[], query: string, opts: SelectOptions = {}): Selection {
  const p: SelectPolicy = { ...DEFAULT_POLICY, ...opts.policy };
  const registry = new FlowRegistry();
  const tenant = 'default';
  const agent = 'default';
  flows.forEach((raw, i) => {
    const parsed = flowDefinitionV1.safeParse(raw);
    if (!parsed.success) {
      throw new PaverError(
        'INPUT_INVALID',
        `flow ${i}: ${parsed.error.issues.map((x) => x.message).join('; ')}`,
      );
    }
    // Every flow given is in the one scope selected from.
    const def: FlowDefinition = { ...parsed.data, tenant_id: tenant, agent_id: agent };
    registry.upsert(registerManual(def, 0));
  });
  const summaries = opts.summaries ?? [];
  const cands = recall(registry, tenant, agent, query, summaries, p);
  return choose(cands, { kind: 'none' }, p, new PromptCache());
}
