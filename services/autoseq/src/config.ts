import { z } from 'zod';
import {
  commonEnvShape,
  crossChecked,
  decimal,
  envBool,
  int,
  refineCommon,
  topicName,
} from '../../../shared/config.js';
import type { AutoseqOptions } from './core/decide.js';
import { DEFAULT_LEARN, type LearnOptions } from './core/learn/learner.js';

export const autoseqEnvSchema = crossChecked(
  z.object({
    ...commonEnvShape,
    AUTOSEQ_GROUP_ID: z.string().min(1).default('paver-autoseq'),
    AUTOSEQ_CATALOG_FILE: z.string().min(1).optional(),
    PAVER_TOPIC_TOOL_CATALOG: topicName.default('paver.tool-catalog.v1'),
    AUTOSEQ_MAX_CONSECUTIVE: int(1, 1000).default(5),
    AUTOSEQ_INCLUDE_ARGUMENTS: envBool.default(true),
    AUTOSEQ_TASK_TTL_MS: int(1000).default(24 * 3_600_000),
    AUTOSEQ_CATALOG_WAIT_MS: int(0, 600_000).default(30_000),
    AUTOSEQ_LEARN_ENABLED: envBool.default(true),
    AUTOSEQ_LEARN_MAX_K: int(1, 8).default(DEFAULT_LEARN.maxK),
    AUTOSEQ_LEARN_MIN_TRIALS: int(1, 100_000).default(DEFAULT_LEARN.minTrials),
    AUTOSEQ_LEARN_MIN_PRECISION: decimal({ gt: 0, lt: 1 }).default(DEFAULT_LEARN.minPrecision),
    AUTOSEQ_LEARN_TARGET_PRECISION: decimal({ min: 0, max: 1 }).default(DEFAULT_LEARN.targetPrecision),
    AUTOSEQ_LEARN_WINDOW: int(2, 1_000_000).default(DEFAULT_LEARN.window),
    /** Own trials of a rule whose family (next tool and bindings, any context) is proven; 0: off. */
    AUTOSEQ_LEARN_FAMILY_TRIALS: int(0, 100_000).default(DEFAULT_LEARN.familyTrials),
    AUTOSEQ_LEARN_MAX_SLOTS: int(10, 1_000_000).default(DEFAULT_LEARN.maxSlots),
    AUTOSEQ_LEARN_MAX_CONTEXTS: int(10, 1_000_000).default(DEFAULT_LEARN.maxContexts),
    AUTOSEQ_LEARN_LEASE_MS: int(1000, 120_000).default(10_000),
    AUTOSEQ_LEARN_TASK_HISTORY: int(1, 1000).default(DEFAULT_LEARN.historyPerTask),
    /** A scope's learned rules are retired (from Redis and the rules topic) this long after the last batch that wrote them; 0: never. */
    AUTOSEQ_LEARN_SCOPE_TTL_MS: int(0, 10 * 365 * 24 * 3_600_000)
      .refine((v) => v === 0 || v >= 60_000, { error: 'expected 0 (never) or at least 60000' })
      .default(30 * 24 * 3_600_000),
    /** Compacted topic of the learned rules' copy: what a Redis loss restores them from. */
    AUTOSEQ_RULES_TOPIC: topicName.default('paver.autoseq-rules.v1'),
    /** How often changed contexts are copied to it; 0: no copy (a Redis loss then loses the rules). */
    AUTOSEQ_RULES_SNAPSHOT_MS: int(0, 3_600_000).default(5000),
  }),
  (env, ctx) =>
    refineCommon(env, ctx, {
      PAVER_TOPIC_TOOL_CATALOG: env.get('PAVER_TOPIC_TOOL_CATALOG'),
      AUTOSEQ_RULES_TOPIC: env.get('AUTOSEQ_RULES_TOPIC'),
    }),
);
export type AutoseqEnv = z.infer<typeof autoseqEnvSchema>;

export const optionsFromEnv = (env: AutoseqEnv): AutoseqOptions => ({
  maxConsecutive: env.AUTOSEQ_MAX_CONSECUTIVE,
  includeArguments: env.AUTOSEQ_INCLUDE_ARGUMENTS,
  seenPerTask: 64,
});

export const learnOptionsFromEnv = (env: AutoseqEnv): LearnOptions => ({
  ...DEFAULT_LEARN,
  maxK: env.AUTOSEQ_LEARN_MAX_K,
  minTrials: env.AUTOSEQ_LEARN_MIN_TRIALS,
  minPrecision: env.AUTOSEQ_LEARN_MIN_PRECISION,
  targetPrecision: env.AUTOSEQ_LEARN_TARGET_PRECISION,
  window: env.AUTOSEQ_LEARN_WINDOW,
  familyTrials: env.AUTOSEQ_LEARN_FAMILY_TRIALS,
  maxSlots: env.AUTOSEQ_LEARN_MAX_SLOTS,
  maxContexts: env.AUTOSEQ_LEARN_MAX_CONTEXTS,
  historyPerTask: env.AUTOSEQ_LEARN_TASK_HISTORY,
});
