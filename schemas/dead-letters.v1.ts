import { z } from 'zod';

export const DEAD_LETTER_REASONS = [
  'oversize',
  'undecodable',
  'invalid',
  'unknown_event_type',
  'registry_error',
  'rejected',
] as const;
export type DeadLetterReason = (typeof DEAD_LETTER_REASONS)[number];

/**
 * A message a service could not use. The original bytes travel base64-encoded so that the record is
 * replayable; `detail` names paths and rules only, never values from the payload.
 */
export const deadLetterRecordV1 = z.object({
  schema_version: z.literal(1),
  service: z.string(),
  reason: z.enum(DEAD_LETTER_REASONS),
  detail: z.string().max(4096),
  source: z.object({
    topic: z.string(),
    partition: z.number().int().nonnegative(),
    offset: z.string().regex(/^\d+$/),
    key_b64: z.string().nullable(),
    timestamp: z.string(),
  }),
  original_size: z.number().int().nonnegative(),
  original_b64: z.string().nullable(),
  dead_lettered_at: z.number().int().nonnegative(),
});
export type DeadLetterRecord = z.infer<typeof deadLetterRecordV1>;
