import { z } from 'zod';
import {
  commonEnvShape,
  crossChecked,
  envBool,
  int,
  refineCommon,
  topicName,
} from '../../../shared/config.js';

export const sequencerEnvSchema = crossChecked(
  z.object({
    ...commonEnvShape,
    SEQUENCER_GROUP_ID: z.string().min(1).default('paver-sequencer'),
    SEQUENCER_CONFIG_FILE: z.string().min(1).optional(),
    PAVER_TOPIC_ORCHESTRATION: topicName.default('paver.orchestration.v1'),
    SEQUENCER_SESSION_TTL_MS: int(1000).default(24 * 3_600_000),
    SEQUENCER_CONFIG_WAIT_MS: int(0, 600_000).default(30_000),
    /** Session states this instance wrote, kept for allowed-tools reads; 0 turns the cache off. */
    SEQUENCER_STATE_CACHE_SIZE: int(0, 10_000_000).default(50_000),
    /** How long a cached state may answer reads: the bound on staleness after another instance took over. */
    SEQUENCER_STATE_CACHE_MAX_AGE_MS: int(0, 3_600_000).default(30_000),
    /** Compacted topic of the session states (written before Redis): what a Redis loss restores them from. */
    SEQUENCER_STATE_TOPIC: topicName.default('paver.sequencer-sessions.v1'),
    /** False: no copy (one record less per changed session and batch); a Redis loss then loses the sessions. */
    SEQUENCER_STATE_COPY_ENABLED: envBool.default(true),
    /**
     * Allowed-tools reads skip the epoch marker's GET while Redis's client-side tracking vouches for it and both its
     * connections answered a PING within this long; 0: every read GETs the marker.
     */
    SEQUENCER_EPOCH_HEARTBEAT_MS: int(0, 60_000).default(200),
  }),
  (env, ctx) =>
    refineCommon(env, ctx, {
      PAVER_TOPIC_ORCHESTRATION: env.get('PAVER_TOPIC_ORCHESTRATION'),
      SEQUENCER_STATE_TOPIC: env.get('SEQUENCER_STATE_TOPIC'),
    }),
);
export type SequencerEnv = z.infer<typeof sequencerEnvSchema>;
