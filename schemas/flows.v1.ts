import { z } from 'zod';
import { LIMITS } from './limits.js';
import { id } from './tool-calls.v1.js';
import { flowStep } from './flow-candidates.v1.js';

const text = z.string().max(LIMITS.textLength);

/** A hand-written flow step: only a name and a skill are required. */
export const manualStepV1 = z
  .object({
    id: z.string().max(256).optional(),
    name: z.string().min(1).max(256),
    skill_key: z.string().min(1).max(LIMITS.toolNameLength).optional(),
    description: text.optional(),
  })
  .passthrough();

/** A flow as the flows file and `POST` bodies give it; `id` is derived (UUID v5) when absent. */
export const flowDefinitionV1 = z
  .object({
    id: z.string().uuid().optional(),
    tenant_id: id.default('default'),
    agent_id: id.default('default'),
    name: z.string().min(1).max(256),
    description: text.default(''),
    condition: text.default(''),
    desired_effects: z.array(z.string().max(4096)).max(100).default([]),
    steps: z
      .array(z.union([flowStep, manualStepV1]))
      .max(256)
      .default([]),
    agent_prompt_hint: text.optional(),
  })
  .strict();

/**
 * A finished run as past-outcome selection keeps it: the terms of its first request (terms only, as in a
 * candidate's request_terms) and the tools it called, in order.
 */
export const pastRunV1 = z
  .object({
    terms: z.array(z.string().min(1).max(64)).max(64),
    calls: z.array(z.string().min(1).max(LIMITS.toolNameLength)).max(1_000),
  })
  .strict();

export const flowsFileV1 = z.union([
  z.array(flowDefinitionV1).max(100_000),
  z
    .object({
      flows: z.array(flowDefinitionV1).max(100_000),
      /** Optional past runs of the same scope: `paver select` then ranks with past outcomes too. */
      past_runs: z.array(pastRunV1).max(100_000).optional(),
    })
    .strict(),
]);

/** A registered flow: a definition with its id, origin and, for promoted candidates, their key. */
export const registeredFlowV1 = flowDefinitionV1.extend({
  id: z.string().uuid(),
  source: z.enum(['manual', 'promoted']),
  dedupe_key: z.string().optional(),
  registered_at: z.number().int().nonnegative(),
});

/** The compacted flows topic, keyed by flow id; a tombstone removes the flow. */
export const flowRegistryRecordV1 = z
  .object({ schema_version: z.literal(1), flow: registeredFlowV1 })
  .strict();

export type PastRun = z.infer<typeof pastRunV1>;
export type FlowDefinition = z.infer<typeof flowDefinitionV1>;
export type RegisteredFlow = z.infer<typeof registeredFlowV1>;
export type FlowRegistryRecord = z.infer<typeof flowRegistryRecordV1>;
