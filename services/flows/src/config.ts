import { z } from 'zod';
import { commonEnvShape, envBool, int, refineCommon, topicName } from '../../../shared/config.js';
import { id } from '../../../schemas/index.js';

const url = z.url({ protocol: /^https?$/ });

export const flowsEnvSchema = z
  .object({
    ...commonEnvShape,
    FLOWS_GROUP_ID: z.string().min(1).default('paver-flows'),
    FLOWS_FILE: z.string().min(1).optional(),
    FLOWS_POLICY_FILE: z.string().min(1).optional(),
    PAVER_TOPIC_FLOWS: topicName.default('paver.flows.v1'),
    FLOWS_PROMOTION: z.enum(['manual', 'auto']).default('manual'),
    FLOWS_AUTO_MIN_OCCURRENCES: int(1).default(10),
    FLOWS_AUTO_MIN_SAVINGS: z.coerce.number().min(0).default(0),
    FLOWS_SHADOW_TRIALS: int(0, 1_000_000).default(5),
    FLOWS_SHADOW_PRECISION: z.coerce.number().min(0).max(1).default(0.6),
    FLOWS_OUTCOME_CAPACITY: int(0, 100_000).default(500),
    FLOWS_OUTCOME_NEIGHBOURS: int(1, 1_000).default(10),
    FLOWS_OUTCOME_WRONG_COST: z.coerce.number().min(0).default(4),
    FLOWS_OUTCOME_FLOOR: z.coerce.number().default(0),
    FLOWS_TOP_K: int(1, 100).default(3),
    FLOWS_RRF_K: int(1, 1000).default(10),
    FLOWS_SCORE_FLOOR: z.coerce.number().min(0).default(0),
    FLOWS_FAIL_OPEN: envBool.default(false),
    FLOWS_SELECT_BUDGET_MS: int(10, 120_000).default(3000),
    FLOWS_CHAT_URL: url.optional(),
    FLOWS_CHAT_MODEL: z.string().min(1).default('gpt-4o-mini'),
    FLOWS_CHAT_API_KEY: z.string().min(1).optional(),
    FLOWS_EMBEDDINGS_URL: url.optional(),
    FLOWS_EMBEDDINGS_MODEL: z.string().min(1).default('text-embedding-3-small'),
    FLOWS_EMBEDDINGS_API_KEY: z.string().min(1).optional(),
    FLOWS_REGISTRY_WAIT_MS: int(0, 600_000).default(30_000),
  })
  .superRefine(refineCommon);
export type FlowsEnv = z.infer<typeof flowsEnvSchema>;

/** Per-agent overrides of the environment's promotion and selection defaults (FLOWS_POLICY_FILE). */
export const policyFileV1 = z
  .object({
    agents: z.array(
      z
        .object({
          tenant_id: id.default('default'),
          agent_id: id.default('default'),
          promotion: z.enum(['manual', 'auto']).optional(),
          auto_min_occurrences: z.number().int().min(1).optional(),
          auto_min_savings: z.number().min(0).optional(),
          shadow_trials: z.number().int().min(0).optional(),
          shadow_precision: z.number().min(0).max(1).optional(),
          outcome_floor: z.number().optional(),
          fail_open: z.boolean().optional(),
          score_floor: z.number().min(0).optional(),
          top_k: z.number().int().min(1).max(100).optional(),
        })
        .strict(),
    ),
  })
  .strict();
export type PolicyFile = z.infer<typeof policyFileV1>;
