import { z } from 'zod';
import { LIMITS } from './limits.js';

/**
 * No control character, and no UTF-16 surrogate without its pair: written as UTF-8 (a Redis key, a Kafka key)
 * every lone surrogate becomes U+FFFD, so `s\ud800` and `s\udc00` would share a session's state in the
 * services while the offline commands kept them apart. Code units, no u flag (as zod and ajv both run it).
 */
// eslint-disable-next-line no-control-regex -- rejecting control characters is the point
const PRINTABLE = /^(?:[^\u0000-\u001f\u007f\ud800-\udfff]|[\ud800-\udbff][\udc00-\udfff])+$/;
const PRINTABLE_MESSAGE = 'must not contain control characters or unpaired surrogates';

/** Identifiers appear in Redis keys and metrics-free logs: bounded and free of control characters. */
export const id = z.string().min(1).max(LIMITS.idLength).regex(PRINTABLE, PRINTABLE_MESSAGE);
export const toolName = z.string().min(1).max(LIMITS.toolNameLength).regex(PRINTABLE, PRINTABLE_MESSAGE);
export const sideEffects = z.enum(['pure', 'read', 'write', 'external']);

const base = {
  event_id: id,
  ts: z.number().int().nonnegative(),
  tenant_id: id.default('default'),
  agent_id: id.default('default'),
  session_id: id,
};

export const toolCallEvent = z.object({
  ...base,
  type: z.literal('tool_call'),
  task_id: id,
  step: z.number().int().min(0).max(LIMITS.maxStep),
  tool: toolName,
  args: z.record(z.string(), z.unknown()).optional(),
  observation: z.unknown().optional(),
  status: z.enum(['ok', 'error']).optional(),
  side_effects: sideEffects.optional(),
  cost_cents: z.number().nonnegative().max(1e6).optional(),
  next_node: z.string().max(LIMITS.idLength).optional(),
  visible_tools: z.array(toolName).max(LIMITS.visibleTools).optional(),
  origin: z.enum(['llm', 'auto_seq', 'flow']).optional(),
  pending_actions: z.number().int().nonnegative().optional(),
});

export const taskCompletedEvent = z.object({
  ...base,
  type: z.literal('task_completed'),
  task_id: id,
  status: z.enum(['ok', 'error']).optional(),
});

export const userMessageEvent = z.object({
  ...base,
  type: z.literal('user_message'),
  task_id: id.optional(),
  text: z.string().max(LIMITS.textLength),
  episode_summaries: z.array(z.string().max(LIMITS.textLength)).max(LIMITS.summaries).optional(),
});

export const TOOL_CALLS_EVENT_TYPES = ['tool_call', 'task_completed', 'user_message'] as const;

/** Input on the tool-calls topic, keyed by session_id. Unknown fields are kept out (zod strips them). */
export const toolCallsEventV1 = z.discriminatedUnion('type', [
  toolCallEvent,
  taskCompletedEvent,
  userMessageEvent,
]);

export type ToolCallsEvent = z.infer<typeof toolCallsEventV1>;
export type ToolCallEvent = z.infer<typeof toolCallEvent>;
export type TaskCompletedEvent = z.infer<typeof taskCompletedEvent>;
export type UserMessageEvent = z.infer<typeof userMessageEvent>;
