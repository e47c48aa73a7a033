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
 * replayable, up to a configured size (PAVER_DEAD_LETTER_MAX_ORIGINAL_BYTES): beyond it `original_b64` is
 * null and the record keeps the size, a SHA-256 and the source position, so it always fits the broker's
 * limit. `detail` names paths and rules only, never values from the payload.
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
    /** Null for a keyless message, and for a key too long to keep (then `key_sha256` is set). */
    key_b64: z.string().nullable(),
    key_sha256: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional(),
    timestamp: z.string(),
  }),
  original_size: z.number().int().nonnegative(),
  original_b64: z.string().nullable(),
  /** SHA-256 (hex) of the original bytes; always set by current writers, absent in older records. */
  original_sha256: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .optional(),
  dead_lettered_at: z.number().int().nonnegative(),
});
export type DeadLetterRecord = z.infer<typeof deadLetterRecordV1>;
