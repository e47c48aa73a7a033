import { z } from 'zod';
import {
  commonEnvShape,
  crossChecked,
  envBool,
  int,
  refineCommon,
  topicName,
} from '../../../shared/config.js';
import type { DetectorParams } from './core/params.js';

export const detectorEnvSchema = crossChecked(
  z.object({
    ...commonEnvShape,
    DETECTOR_GROUP_ID: z.string().min(1).default('paver-detector'),
    DETECTOR_MIN_LENGTH: int(1, 100).default(3),
    DETECTOR_MAX_LENGTH: int(1, 100).default(12),
    DETECTOR_MIN_OCCURRENCES: int(1, 1_000_000).default(3),
    DETECTOR_LOOKBACK: int(1, 1_000_000).default(200),
    DETECTOR_MAX_CANDIDATES: int(1, 1000).default(5),
    DETECTOR_WINDOW_MS: int(1).optional(),
    DETECTOR_TASK_IDLE_MS: int(1).default(30 * 60_000),
    DETECTOR_DONE_RETENTION_MS: int(1).default(24 * 3_600_000),
    DETECTOR_MAX_TASK_EVENTS: int(1, 100_000).default(1000),
    /**
     * An event whose ts is this far ahead of its Kafka record's timestamp is ignored (reason `future`): one
     * event from a host whose clock runs ahead would move its partition's clock and make every task of the
     * hosts that are right late. 0 turns the check off.
     */
    DETECTOR_MAX_AHEAD_MS: int(0).default(5 * 60_000),
    /** Stores the terms (never the text) of each task's first user message; see the README. */
    DETECTOR_REQUEST_TERMS: envBool.default(true),
    /** Compacted topic of replay checkpoints: where a rebuild after a Redis loss starts, per partition. */
    DETECTOR_TOPIC_CHECKPOINTS: topicName.default('paver.detector-checkpoints.v1'),
    /** How often (at most) each partition's checkpoint is recomputed and written; 0 = after every chunk. */
    DETECTOR_CHECKPOINT_INTERVAL_MS: int(0).default(5_000),
    /**
     * A scope (tenant, agent) that no event has reached for this long is retired: its candidates retracted and
     * its state deleted from Redis. 0: never.
     */
    DETECTOR_SCOPE_TTL_MS: int(0, 10 * 365 * 24 * 3_600_000)
      .refine((v) => v === 0 || v >= 60_000, { error: 'expected 0 (never) or at least 60000' })
      .default(30 * 24 * 3_600_000),
  }),
  (env, ctx) => {
    refineCommon(env, ctx, { DETECTOR_TOPIC_CHECKPOINTS: env.get('DETECTOR_TOPIC_CHECKPOINTS') });
    env.with(['DETECTOR_MIN_LENGTH', 'DETECTOR_MAX_LENGTH'], (e) => {
      if (e.DETECTOR_MAX_LENGTH < e.DETECTOR_MIN_LENGTH) {
        ctx.addIssue({
          code: 'custom',
          path: ['DETECTOR_MAX_LENGTH'],
          message: 'must be ≥ DETECTOR_MIN_LENGTH',
        });
      }
    });
    // Support counts the window's tasks that hold a sequence: it never passes the window's size, so no candidate
    // could ever be found, and nothing said so.
    env.with(['DETECTOR_MIN_OCCURRENCES', 'DETECTOR_LOOKBACK'], (e) => {
      if (e.DETECTOR_MIN_OCCURRENCES > e.DETECTOR_LOOKBACK) {
        ctx.addIssue({
          code: 'custom',
          path: ['DETECTOR_MIN_OCCURRENCES'],
          message: `must be ≤ DETECTOR_LOOKBACK (${e.DETECTOR_LOOKBACK}), the tasks a sequence's occurrences are counted in`,
        });
      }
    });
    // A task is closed as idle after DETECTOR_TASK_IDLE_MS; its id must be remembered at least that long, or
    // an event of it redelivered (a restart) between the two is neither a duplicate nor late: it reopens the
    // task, whose fragment then replaces its whole record.
    env.with(['DETECTOR_TASK_IDLE_MS', 'DETECTOR_DONE_RETENTION_MS'], (e) => {
      if (e.DETECTOR_DONE_RETENTION_MS < e.DETECTOR_TASK_IDLE_MS) {
        ctx.addIssue({
          code: 'custom',
          path: ['DETECTOR_DONE_RETENTION_MS'],
          message: `must be ≥ DETECTOR_TASK_IDLE_MS (${e.DETECTOR_TASK_IDLE_MS}): a redelivered event of a task closed as idle would reopen it`,
        });
      }
    });
  },
);
export type DetectorEnv = z.infer<typeof detectorEnvSchema>;

export function paramsFromEnv(env: DetectorEnv): DetectorParams {
  return {
    minLength: env.DETECTOR_MIN_LENGTH,
    maxLength: env.DETECTOR_MAX_LENGTH,
    minOccurrences: env.DETECTOR_MIN_OCCURRENCES,
    lookback: env.DETECTOR_LOOKBACK,
    maxCandidates: env.DETECTOR_MAX_CANDIDATES,
    windowMs: env.DETECTOR_WINDOW_MS ?? null,
    taskIdleMs: env.DETECTOR_TASK_IDLE_MS,
    doneRetentionMs: env.DETECTOR_DONE_RETENTION_MS,
    maxTaskEvents: env.DETECTOR_MAX_TASK_EVENTS,
    requestTerms: env.DETECTOR_REQUEST_TERMS,
  };
}
