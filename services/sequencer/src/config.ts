import { z } from 'zod';
import { commonEnvShape, int, refineCommon, topicName } from '../../../shared/config.js';

export const sequencerEnvSchema = z
  .object({
    ...commonEnvShape,
    SEQUENCER_GROUP_ID: z.string().min(1).default('paver-sequencer'),
    SEQUENCER_CONFIG_FILE: z.string().min(1).optional(),
    PAVER_TOPIC_ORCHESTRATION: topicName.default('paver.orchestration.v1'),
    SEQUENCER_SESSION_TTL_MS: int(1000).default(24 * 3_600_000),
    SEQUENCER_CONFIG_WAIT_MS: int(0, 600_000).default(30_000),
  })
  .superRefine(refineCommon);
export type SequencerEnv = z.infer<typeof sequencerEnvSchema>;
