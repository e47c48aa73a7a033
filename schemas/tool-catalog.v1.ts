import { z } from 'zod';
import { LIMITS } from './limits.js';
import { id, sideEffects, toolName } from './tool-calls.v1.js';

const names = z.array(toolName).max(LIMITS.visibleTools);

/** One tool as LLM tool specs carry it, plus its auto-seq opt-ins. */
export const catalogToolV1 = z
  .object({
    name: toolName,
    description: z.string().max(LIMITS.textLength).default(''),
    /** A JSON Schema (draft-07 / 2019-09 keywords) for the tool's arguments. */
    args_schema: z.record(z.string(), z.unknown()),
    /** Absent means unknown, which Paver treats as not read-only. */
    side_effects: sideEffects.optional(),
    auto_seq: z.boolean().default(false),
    auto_seq_execute: z.boolean().default(false),
    /** The upstream tools this tool may follow; required for a tool whose schema requires nothing. */
    auto_seq_from: names.optional(),
  })
  .strict();

export const catalogPolicyV1 = z
  .object({
    auto_seq_enabled: z.boolean().default(false),
    auto_seq_execute: z.boolean().default(false),
    auto_seq_read_only_only: z.boolean().default(true),
    denied_tools: names.default([]),
    /** The visibility scope (null = every catalog tool); an event's `visible_tools` narrow it, never widen it. */
    visible_tools: names.nullable().default(null),
  })
  .strict();

export const agentCatalogV1 = z
  .object({
    tenant_id: id.default('default'),
    agent_id: id.default('default'),
    policy: catalogPolicyV1.default(catalogPolicyV1.parse({})),
    tools: z.array(catalogToolV1).max(LIMITS.catalogTools),
  })
  .strict();

/** The catalog file (`AUTOSEQ_CATALOG_FILE`, `paver autoseq --catalog`). */
export const catalogFileV1 = z.object({ agents: z.array(agentCatalogV1).max(10_000) }).strict();

/**
 * Records on the compacted tool-catalog topic. Key: `tenant_id/agent_id/tool/NAME` for a tool and
 * `tenant_id/agent_id/policy` for the policy (each part URI-encoded); a tombstone on a tool key removes it.
 */
export const toolCatalogRecordV1 = z.discriminatedUnion('kind', [
  z
    .object({
      schema_version: z.literal(1),
      kind: z.literal('tool'),
      tenant_id: id.default('default'),
      agent_id: id.default('default'),
      tool: catalogToolV1,
    })
    .strict(),
  z
    .object({
      schema_version: z.literal(1),
      kind: z.literal('policy'),
      tenant_id: id.default('default'),
      agent_id: id.default('default'),
      policy: catalogPolicyV1,
    })
    .strict(),
  z
    .object({
      schema_version: z.literal(1),
      kind: z.literal('tool_removed'),
      tenant_id: id.default('default'),
      agent_id: id.default('default'),
      name: toolName,
    })
    .strict(),
]);

export type CatalogTool = z.infer<typeof catalogToolV1>;
export type CatalogPolicy = z.infer<typeof catalogPolicyV1>;
export type AgentCatalog = z.infer<typeof agentCatalogV1>;
export type CatalogFile = z.infer<typeof catalogFileV1>;
export type ToolCatalogRecord = z.infer<typeof toolCatalogRecordV1>;

export const catalogKey = (tenant: string, agent: string, ...rest: string[]): string =>
  [tenant, agent, ...rest].map(encodeURIComponent).join('/');
