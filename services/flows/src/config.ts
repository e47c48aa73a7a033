import { z } from 'zod';
import {
  MAX_TOPIC_NAME,
  commonEnvShape,
  crossChecked,
  decimal,
  envBool,
  httpUrl,
  int,
  parseEnv,
  refineCommon,
  topicName,
} from '../../../shared/config.js';
import { id } from '../../../schemas/index.js';
import { loadFile } from './adapters/files.js';
import type { OutcomePolicy } from './core/outcomes.js';
import type { PromotionPolicy } from './core/promotion.js';
import { DEFAULT_POLICY, type SelectPolicy } from './core/select.js';

export const flowsEnvSchema = crossChecked(
  z.object({
    ...commonEnvShape,
    FLOWS_GROUP_ID: z.string().min(1).default('paver-flows'),
    FLOWS_FILE: z.string().min(1).optional(),
    FLOWS_POLICY_FILE: z.string().min(1).optional(),
    PAVER_TOPIC_FLOWS: topicName.default('paver.flows.v1'),
    // Unset: `<PAVER_TOPIC_FLOWS>.state` (the candidates' states belong with the registry they feed).
    FLOWS_STATE_TOPIC: topicName.optional(),
    FLOWS_PROMOTION: z.enum(['manual', 'auto']).default('manual'),
    FLOWS_AUTO_MIN_OCCURRENCES: int(1).default(10),
    FLOWS_AUTO_MIN_SAVINGS: decimal({ min: 0 }).default(0),
    FLOWS_SHADOW_TRIALS: int(0, 1_000_000).default(5),
    FLOWS_SHADOW_PRECISION: decimal({ min: 0, max: 1 }).default(0.5),
    FLOWS_OUTCOME_CAPACITY: int(0, 100_000).default(500),
    FLOWS_EVIDENCE_RUNS: int(0, 100_000).default(200),
    // One session's worth at least (EVIDENCE_SESSION_CHARS); 64 Mi by default (DEFAULT_EVIDENCE_MAX_CHARS).
    FLOWS_EVIDENCE_MAX_CHARS: int(262_144, 2 ** 31 - 1).default(67_108_864),
    // An open session is kept in Redis this long after its last event (one idler is taken as abandoned).
    FLOWS_SESSION_TTL_MS: int(60_000, 30 * 86_400_000).default(86_400_000),
    FLOWS_OUTCOME_NEIGHBOURS: int(1, 1_000).default(10),
    FLOWS_OUTCOME_WRONG_COST: decimal({ min: 0 }).default(4),
    FLOWS_OUTCOME_FLOOR: decimal().default(0),
    FLOWS_OUTCOME_WEIGHT: decimal({ min: 0, max: 100 }).default(1),
    FLOWS_TOP_K: int(1, 100).default(3),
    FLOWS_RRF_K: int(1, 1000).default(10),
    FLOWS_SCORE_FLOOR: decimal({ min: 0 }).default(0),
    FLOWS_PREFIX_BACKOFF: envBool.default(true),
    FLOWS_FAIL_OPEN: envBool.default(false),
    FLOWS_SELECT_BUDGET_MS: int(10, 120_000).default(3000),
    FLOWS_CHAT_URL: httpUrl.optional(),
    FLOWS_CHAT_MODEL: z.string().min(1).default('gpt-4o-mini'),
    FLOWS_CHAT_API_KEY: z.string().min(1).optional(),
    FLOWS_EMBEDDINGS_URL: httpUrl.optional(),
    FLOWS_EMBEDDINGS_MODEL: z.string().min(1).default('text-embedding-3-small'),
    FLOWS_EMBEDDINGS_API_KEY: z.string().min(1).optional(),
    FLOWS_REGISTRY_WAIT_MS: int(0, 600_000).default(30_000),
    // How often the flows topic is checked against the candidates' states (0: never); flows promoted less than
    // FLOWS_RECONCILE_MIN_AGE_MS ago are left to their promotion.
    FLOWS_RECONCILE_MS: int(0, 86_400_000).default(300_000),
    FLOWS_RECONCILE_MIN_AGE_MS: int(1_000, 86_400_000).default(120_000),
  }),
  (env, ctx) => {
    const stateTopic = env.with(['FLOWS_STATE_TOPIC', 'PAVER_TOPIC_FLOWS'], stateTopicOf);
    refineCommon(env, ctx, {
      PAVER_TOPIC_FLOWS: env.get('PAVER_TOPIC_FLOWS'),
      FLOWS_STATE_TOPIC: stateTopic,
    });
    if (stateTopic !== undefined && stateTopic.length > MAX_TOPIC_NAME)
      ctx.addIssue({
        code: 'custom',
        path: ['FLOWS_STATE_TOPIC'],
        message: `unset, it is <PAVER_TOPIC_FLOWS>.state, longer than Kafka's ${MAX_TOPIC_NAME} characters: set it`,
      });
    // A key alone selected with no model at all (there is no default endpoint): set for OpenAI, it was dropped
    // without a word and every selection took the top-ranked candidate.
    for (const [key, url] of [
      ['FLOWS_CHAT_API_KEY', 'FLOWS_CHAT_URL'],
      ['FLOWS_EMBEDDINGS_API_KEY', 'FLOWS_EMBEDDINGS_URL'],
    ] as const)
      env.with([key, url], (e) => {
        if (e[key] && !e[url])
          ctx.addIssue({
            code: 'custom',
            path: [url],
            message: `required with ${key} (the endpoint's base URL, e.g. https://api.openai.com/v1)`,
          });
      });
  },
);
export type FlowsEnv = z.infer<typeof flowsEnvSchema>;
export const stateTopicOf = (env: Pick<FlowsEnv, 'FLOWS_STATE_TOPIC' | 'PAVER_TOPIC_FLOWS'>) =>
  env.FLOWS_STATE_TOPIC ?? `${env.PAVER_TOPIC_FLOWS}.state`;

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

/**
 * FLOWS_POLICY_FILE as read (no file: no overrides). The service and the offline commands read it alike: a
 * command that left it out chose and promoted otherwise than the service for every agent it names. A file that
 * cannot be read or is not one is a CONFIG_INVALID PaverError, as for the service's other files (`loadFile`).
 */
export const readPolicyFile = async (env: Pick<FlowsEnv, 'FLOWS_POLICY_FILE'>): Promise<PolicyFile> =>
  env.FLOWS_POLICY_FILE ? loadFile(env.FLOWS_POLICY_FILE, policyFileV1, 'FLOWS_POLICY_FILE') : { agents: [] };

/** Environment defaults, overridden per (tenant, agent) by FLOWS_POLICY_FILE. */
export function policies(env: FlowsEnv, overrides: PolicyFile) {
  const policyOf = (tenant: string, agent: string) =>
    overrides.agents.find((a) => a.tenant_id === tenant && a.agent_id === agent);
  return {
    outcome: (): OutcomePolicy => ({
      capacity: env.FLOWS_OUTCOME_CAPACITY,
      neighbours: env.FLOWS_OUTCOME_NEIGHBOURS,
      wrongCost: env.FLOWS_OUTCOME_WRONG_COST,
    }),
    promotion(tenant: string, agent: string): PromotionPolicy {
      const o = policyOf(tenant, agent);
      return {
        mode: o?.promotion ?? env.FLOWS_PROMOTION,
        minOccurrences: o?.auto_min_occurrences ?? env.FLOWS_AUTO_MIN_OCCURRENCES,
        minSavings: o?.auto_min_savings ?? env.FLOWS_AUTO_MIN_SAVINGS,
        shadowTrials: o?.shadow_trials ?? env.FLOWS_SHADOW_TRIALS,
        shadowPrecision: o?.shadow_precision ?? env.FLOWS_SHADOW_PRECISION,
      };
    },
    select(tenant: string, agent: string): SelectPolicy {
      const o = policyOf(tenant, agent);
      return {
        ...DEFAULT_POLICY,
        topK: o?.top_k ?? env.FLOWS_TOP_K,
        rrfK: env.FLOWS_RRF_K,
        scoreFloor: o?.score_floor ?? env.FLOWS_SCORE_FLOOR,
        failOpen: o?.fail_open ?? env.FLOWS_FAIL_OPEN,
        outcomeFloor: o?.outcome_floor ?? env.FLOWS_OUTCOME_FLOOR,
        outcomeWeight: env.FLOWS_OUTCOME_WEIGHT,
        prefixBackoff: env.FLOWS_PREFIX_BACKOFF,
      };
    },
  };
}

/**
 * The service's settings for an offline command: FLOWS_* from the environment, everything else at its default
 * (no broker or Redis is contacted). Read as the service reads them (parseEnv): an empty variable is unset, so
 * `FLOWS_TOP_K=` means the default here too, and an error lists the variables in one message, not zod's JSON.
 */
export function offlineEnv(env: NodeJS.ProcessEnv): FlowsEnv {
  const flows = Object.fromEntries(Object.entries(env).filter(([k]) => k.startsWith('FLOWS_')));
  // parseEnv, as the service: one message naming each bad variable (zod's own error is a JSON dump of issues).
  return parseEnv(flowsEnvSchema, {
    KAFKA_BROKERS: 'offline:9092',
    REDIS_URL: 'redis://offline:6379',
    ...flows,
  });
}
