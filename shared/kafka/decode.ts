import type { z } from 'zod';
import type { DeadLetterReason } from '../../schemas/index.js';
import { DecodeError, type Codec } from '../codec.js';

/** Either a typed value or a dead-letter reason; the default uses a zod schema plus a known-type check. */
export type Parser<T> = (
  value: unknown,
  topic: string,
) => { ok: true; value: T } | { ok: false; reason: DeadLetterReason; detail: string };

export type Decoded<T> = ReturnType<Parser<T>>;

export function zodParser<S extends z.ZodType>(
  schema: S,
  knownTypes?: readonly string[],
): Parser<z.infer<S>> {
  return (value) => {
    if (knownTypes && value !== null && typeof value === 'object' && !Array.isArray(value)) {
      const type = (value as { type?: unknown }).type;
      if (typeof type === 'string' && !knownTypes.includes(type)) {
        return {
          ok: false,
          reason: 'unknown_event_type',
          detail: `type must be one of ${knownTypes.join(', ')}`,
        };
      }
    }
    const r = schema.safeParse(value);
    if (r.success) return { ok: true, value: r.data };
    // Paths and messages only: zod's messages name expected types, not the offending values.
    const detail = r.error.issues
      .slice(0, 10)
      .map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`)
      .join('; ');
    return { ok: false, reason: 'invalid', detail };
  };
}

export interface DecodeOptions<T> {
  codec: Codec;
  parse: Parser<T>;
  /** Compacted topics: maps a tombstone (null value) to a typed record; without it a tombstone is dead-lettered. */
  tombstone?: ((key: string | null) => T | null) | undefined;
  /** PAVER_MAX_MESSAGE_BYTES: bigger values are dead-lettered `oversize` before any parsing. */
  maxBytes: number;
}

/**
 * One message to a typed value or a dead-letter reason. Throws only what a retry may cure (a registry that
 * does not answer); everything about the bytes themselves is an answer, not an exception.
 */
export async function decodeMessage<T>(
  msg: { key: Buffer | null; value: Buffer | null },
  topic: string,
  o: DecodeOptions<T>,
): Promise<Decoded<T>> {
  if (msg.value === null && o.tombstone) {
    const t = o.tombstone(msg.key === null ? null : msg.key.toString('utf8'));
    if (t !== null) return { ok: true, value: t };
  }
  if (!msg.value || msg.value.length === 0)
    return { ok: false, reason: 'undecodable', detail: 'empty message value' };
  if (msg.value.length > o.maxBytes) {
    return { ok: false, reason: 'oversize', detail: `${msg.value.length} bytes > PAVER_MAX_MESSAGE_BYTES` };
  }
  let raw: unknown;
  try {
    raw = await o.codec.decode(msg.value);
  } catch (err) {
    if (err instanceof DecodeError) return { ok: false, reason: err.reason, detail: err.message };
    throw err;
  }
  return o.parse(raw, topic);
}
