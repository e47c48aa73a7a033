import { z } from 'zod';
import { LIMITS } from './limits.js';
import { id, toolName } from './tool-calls.v1.js';

/** A tool name or a pattern with `*` wildcards (`*cognitive*`). */
const toolPattern = z.string().min(1).max(LIMITS.toolNameLength);

export const orchestrationConditionV1 = z.discriminatedUnion('type', [
  /** The latest user message matches (RE2, case-insensitive). */
  z.object({ type: z.literal('message_regex'), value: z.string().min(1).max(1024) }).strict(),
  /** The tool appears in the session's recent tool history. */
  z.object({ type: z.literal('tool_used'), value: toolName }).strict(),
  /**
   * The most recent tools are exactly these, in this order (a comma-separated string or an array); without a
   * value, the step's own sequence (AgentDock's meaning).
   */
  z
    .object({
      type: z.literal('sequence_match'),
      value: z
        .union([
          z.array(toolName).min(1).max(64),
          z
            .string()
            .min(1)
            .max(4096)
            .transform((s) =>
              s
                .split(',')
                .map((x) => x.trim())
                .filter(Boolean),
            ),
        ])
        .optional(),
    })
    .strict(),
]);

export const orchestrationStepV1 = z
  .object({
    name: z.string().min(1).max(LIMITS.idLength),
    description: z.string().max(LIMITS.textLength).default(''),
    conditions: z.array(orchestrationConditionV1).max(32).default([]),
    availableTools: z
      .object({
        allowed: z.array(toolPattern).max(LIMITS.visibleTools).optional(),
        denied: z.array(toolPattern).max(LIMITS.visibleTools).optional(),
      })
      .strict()
      .default({}),
    /** Tool names, or groups of alternatives at a position. */
    sequence: z
      .array(z.union([toolName, z.array(toolName).min(1).max(64)]))
      .max(256)
      .optional(),
    isDefault: z.boolean().default(false),
  })
  .strict();

export const orchestrationOptionsV1 = z
  .object({
    /** What a tool that is not the expected one does: record it (`warn`), restart the sequence, or hold the step. */
    violation_policy: z.enum(['warn', 'reset', 'hold']).default('warn'),
    /** A step whose sequence is in progress stays active until it completes. */
    sticky_sequences: z.boolean().default(true),
  })
  .strict();

/** One agent's orchestration: the reference's own shape, plus the scope and options. */
export const agentOrchestrationV1 = z
  .object({
    tenant_id: id.default('default'),
    agent_id: id.default('default'),
    tools: z.array(toolName).max(LIMITS.visibleTools).default([]),
    steps: z.array(orchestrationStepV1).max(1000),
    options: orchestrationOptionsV1.default(orchestrationOptionsV1.parse({})),
  })
  .strict();

/** The configuration file: one agent in the reference's shape, or `{ agents: [...] }`. */
export const orchestrationFileV1 = z.union([
  z.object({ agents: z.array(agentOrchestrationV1).max(10_000) }).strict(),
  agentOrchestrationV1,
]);

/** Records on the compacted orchestration topic, keyed `tenant_id/agent_id` (URI-encoded parts); a tombstone removes it. */
export const orchestrationRecordV1 = agentOrchestrationV1.extend({ schema_version: z.literal(1) });

export type OrchestrationCondition = z.infer<typeof orchestrationConditionV1>;
export type OrchestrationStep = z.infer<typeof orchestrationStepV1>;
export type AgentOrchestration = z.infer<typeof agentOrchestrationV1>;
export type OrchestrationRecord = z.infer<typeof orchestrationRecordV1>;
