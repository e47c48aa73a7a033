import { z } from 'zod';
import { commonEnvShape, envBool, int, refineCommon, topicName } from '../../../shared/config.js';
import type { AutoseqOptions } from './core/decide.js';

export const autoseqEnvSchema = z
  .object({
    ...commonEnvShape,
    AUTOSEQ_GROUP_ID: z.string().min(1).default('paver-autoseq'),
    AUTOSEQ_CATALOG_FILE: z.string().min(1).optional(),
    PAVER_TOPIC_TOOL_CATALOG: topicName.default('paver.tool-catalog.v1'),
    AUTOSEQ_MAX_CONSECUTIVE: int(1, 1000).default(5),
    AUTOSEQ_INCLUDE_ARGUMENTS: envBool.default(true),
    AUTOSEQ_TASK_TTL_MS: int(1000).default(24 * 3_600_000),
    AUTOSEQ_CATALOG_WAIT_MS: int(0, 600_000).default(30_000),
  })
  .superRefine(refineCommon);
export type AutoseqEnv = z.infer<typeof autoseqEnvSchema>;

export const optionsFromEnv = (env: AutoseqEnv): AutoseqOptions => ({
  maxConsecutive: env.AUTOSEQ_MAX_CONSECUTIVE,
  includeArguments: env.AUTOSEQ_INCLUDE_ARGUMENTS,
  seenPerTask: 64,
});
