import { z } from 'zod';
import { id } from './tool-calls.v1.js';

/** One flow selection per user_message, on the flow-selections topic keyed by session_id. */
export const flowSelectionRecordV1 = z.object({
  schema_version: z.literal(1),
  tenant_id: id,
  agent_id: id,
  session_id: id,
  event_id: id,
  ts: z.number().int().nonnegative(),
  // top_ranked: several candidates and no model configured (the normal no-model case); fallback: a model was
  // asked and failed or answered nothing usable. Added values only: consumers of v1 keep validating.
  path: z.enum(['none', 'fast_path', 'model', 'fallback', 'fail_open', 'top_ranked']),
  chosen: z.array(z.object({ id: z.string(), name: z.string() })),
  chosen_prompts: z.array(z.string()),
  combined_prompt: z.string(),
  unresolved_ids: z.array(z.string()),
  candidates: z.array(z.object({ id: z.string(), name: z.string(), score: z.number() })),
});
export type FlowSelectionRecord = z.infer<typeof flowSelectionRecordV1>;
