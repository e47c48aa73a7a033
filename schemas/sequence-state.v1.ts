import { z } from 'zod';
import { id, toolName } from './tool-calls.v1.js';

/** Allowed tools after every processed event, on the sequence-state topic keyed by session_id. */
export const sequenceStateRecordV1 = z.object({
  schema_version: z.literal(1),
  tenant_id: id,
  agent_id: id,
  session_id: id,
  event_id: id,
  ts: z.number().int().nonnegative(),
  active_step: z.string().nullable(),
  sequence_index: z.number().int().nonnegative(),
  expected: z.array(toolName),
  allowed_tools: z.array(toolName),
  completed: z.boolean(),
  violation: z
    .object({ expected: z.array(toolName), used: toolName, policy: z.enum(['warn', 'reset', 'hold']) })
    .nullable(),
});
export type SequenceStateRecord = z.infer<typeof sequenceStateRecordV1>;
