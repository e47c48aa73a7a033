import { z } from 'zod';
import { id, toolName } from './tool-calls.v1.js';

export const AUTOSEQ_SKIP_REASONS = [
  'disabled',
  'non_structured_observation',
  'previous_step_parallel',
  'pending_actions_present',
  'error_observation',
  'loop_guard',
] as const;

/**
 * auto-seq decisions and executions on the next-actions topic, keyed by session_id. A learned proposal is an
 * `auto_seq_detected_unique` with `origin: "learned"`; `execute` is true only for an active rule whose tool
 * passes the execution gates (read-only per the catalog, loop guard, max consecutive).
 */
export const nextActionRecordV1 = z.object({
  schema_version: z.literal(1),
  event_type: z.enum([
    'auto_seq_detected_unique',
    'auto_seq_detected_ambiguous',
    'auto_seq_detected_none',
    'auto_seq_skipped',
    'auto_seq_executed',
  ]),
  tenant_id: id,
  agent_id: id,
  session_id: id,
  task_id: id,
  event_id: id,
  step: z.number().int().nonnegative(),
  ts: z.number().int().nonnegative(),
  tool: toolName.optional(),
  candidates: z.array(toolName).optional(),
  candidate_count: z.number().int().nonnegative().optional(),
  reason: z.enum(AUTOSEQ_SKIP_REASONS).optional(),
  execute: z.boolean().optional(),
  payload_fingerprint: z.string().optional(),
  payload_keys_count: z.number().int().nonnegative().optional(),
  payload_type: z.string().optional(),
  /** Present only for an executable unique decision, and only when enabled by configuration. */
  arguments: z.record(z.string(), z.unknown()).optional(),
  /**
   * The decision's `arguments` were left out: the record would have been over PAVER_MAX_OUTPUT_BYTES. The call's
   * arguments are the previous tool's output, which the runtime holds.
   */
  arguments_omitted: z.literal(true).optional(),
  /** Which decider made a unique decision: the catalog's schemas (`typed`) or a rule learned from the stream. */
  origin: z.enum(['typed', 'learned']).optional(),
  /** Learned proposals only: the rule, its state when it proposed, its precision's Wilson lower bound and trials. */
  rule_id: z.string().max(64).optional(),
  rule_state: z.enum(['shadow', 'active', 'demoted']).optional(),
  confidence: z.number().min(0).max(1).optional(),
  trials: z.number().int().nonnegative().optional(),
  /** The proposed call's arguments, built from learned bindings (always present on a learned proposal). */
  args: z.record(z.string(), z.unknown()).optional(),
});
export type NextActionRecord = z.infer<typeof nextActionRecordV1>;
