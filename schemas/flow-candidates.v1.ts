import { z } from 'zod';
import { id, toolName } from './tool-calls.v1.js';

export const flowStep = z.object({
  id: z.string(),
  name: z.string(),
  skill_key: toolName,
  depends_on: z.array(z.string()),
  output_key: z.string(),
  retry_max: z.number().int(),
  retry_backoff: z.number(),
  timeout_seconds: z.number().int(),
  on_failure: z.enum(['stop', 'continue']),
  input_map: z.record(z.string(), z.string()),
  /**
   * A loop: this step and the next `body - 1` steps run once per element of the list `over` (a reference
   * such as `{{step_1.output.reservations}}`), or of a list not known (`over: null`) when past runs did not
   * show where it came from. Inside the body, `{{item}}` / `{{item.path}}` name the current element.
   */
  for_each: z
    .object({ over: z.string().nullable(), body: z.number().int().positive().default(1) })
    .optional(),
  /**
   * How `input_map` was obtained: `data_flow` when learned from past runs (each entry's source reproduced the
   * argument in every occurrence seen); `unknown` when no run data was available, so no argument is bound.
   */
  inputs: z.enum(['data_flow', 'unknown']).optional(),
  /** Arguments past runs passed that no source explained consistently: the caller must supply them. */
  unbound: z.array(z.string()).optional(),
});

export const proposedFlow = z.object({
  name: z.string(),
  description: z.string(),
  steps: z.array(flowStep).min(1),
  tags: z.array(z.string()),
});

/**
 * Bounded term statistics of the first user message of each task that contained the sequence: terms
 * only (stop words, numbers and identifiers removed), never raw text. `df` = in how many of those tasks
 * the term appeared. Lets selection match requests in the users' own words.
 */
export const requestTerms = z.object({
  tasks: z.number().int().nonnegative(),
  terms: z.array(z.object({ term: z.string().min(1).max(64), df: z.number().int().positive() })).max(64),
});

/** The candidate shape of flow-sequence-detector.txt (what `paver detect` prints, one per array item). */
export const flowCandidate = z.object({
  tool_sequence: z.array(toolName).min(1),
  occurrence_count: z.number().int().positive(),
  match_type: z.enum(['exact', 'subsequence']),
  estimated_token_savings: z.number().nonnegative(),
  avg_cost_per_execution: z.number().nonnegative(),
  dedupe_key: z.string(),
  proposed_flow: proposedFlow,
  request_terms: requestTerms.optional(),
});

/**
 * A record on the flow-candidates topic (compacted, keyed by dedupe_key): the reference's adaptation
 * payload plus scope and lifecycle. A candidate that leaves the live set is published as `retracted`.
 */
export const flowCandidateRecordV1 = z.object({
  schema_version: z.literal(1),
  status: z.enum(['active', 'retracted']),
  tenant_id: id,
  agent_id: id,
  dedupe_key: z.string(),
  detected_at: z.number().int().nonnegative(),
  title: z.string(),
  source_kind: z.literal('tool_sequence'),
  occurrence_count: z.number().int().nonnegative(),
  estimated_token_savings: z.number().nonnegative(),
  candidate: flowCandidate.nullable(),
  promotion_effect: z
    .object({
      effect_type: z.literal('flow_offload_registration'),
      proposed_flow: proposedFlow,
      agent_prompt_hint: z.string(),
      reason: z.string(),
    })
    .nullable(),
});

export type FlowStep = z.infer<typeof flowStep>;
export type ProposedFlow = z.infer<typeof proposedFlow>;
export type RequestTerms = z.infer<typeof requestTerms>;
export type FlowCandidate = z.infer<typeof flowCandidate>;
export type FlowCandidateRecord = z.infer<typeof flowCandidateRecordV1>;
