import type { z } from 'zod';
import { checker } from '../validate.js';
import type { DeadLetterReason } from '../../schemas/index.js';
import { DecodeError, type Codec } from '../codec.js';
import { deeperThan, TOO_DEEP } from '../core/json-depth.js';

/** Either a typed value or a dead-letter reason; the default uses a zod schema plus a known-type check. */
export type Parser<T> = (
  value: unknown,
  topic: string,
) => { ok: true; value: T } | { ok: false; reason: DeadLetterReason; detail: string };

export type Decoded<T> = ReturnType<Parser<T>>;

/**
 * Validates with the contract's compiled form when it has one (shared/validate.ts), zod otherwise; a refused
 * value always gets zod's verdict and messages.
 */
export function zodParser<S extends z.ZodType>(
  schema: S,
  knownTypes?: readonly string[],
): Parser<z.infer<S>> {
  const check = checker(schema);
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
    const r = check(value);
    // Paths and messages only: zod's messages name expected types, not the offending values. A valid
    // value's answer is the checker's own object (no second one per message).
    return r.ok ? r : { ok: false, reason: 'invalid', detail: r.detail };
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

/** Checks on the bytes before any decoding: a tombstone, an empty value, an oversize one. */
function precheck<T>(
  msg: { key: Buffer | null; value: Buffer | null },
  o: DecodeOptions<T>,
): Decoded<T> | undefined {
  if (msg.value === null && o.tombstone) {
    const t = o.tombstone(msg.key === null ? null : msg.key.toString('utf8'));
    if (t !== null) return { ok: true, value: t };
  }
  if (!msg.value || msg.value.length === 0)
    return { ok: false, reason: 'undecodable', detail: 'empty message value' };
  if (msg.value.length > o.maxBytes) {
    return { ok: false, reason: 'oversize', detail: `${msg.value.length} bytes > PAVER_MAX_MESSAGE_BYTES` };
  }
  return undefined;
}

/**
 * The hot path: one message to a typed value or a dead-letter reason with no promise, or `undefined` when only
 * the asynchronous `decodeMessage` can answer (Confluent framing: a registry lookup). Never throws for bad
 * bytes.
 */
export function decodeMessageSync<T>(
  msg: { key: Buffer | null; value: Buffer | null },
  topic: string,
  o: DecodeOptions<T>,
): Decoded<T> | undefined {
  const pre = precheck(msg, o);
  if (pre) return pre;
  if (!o.codec.decodeSync) return undefined;
  let raw: { value: unknown } | undefined;
  try {
    raw = o.codec.decodeSync(msg.value!);
  } catch (err) {
    if (err instanceof DecodeError) return { ok: false, reason: err.reason, detail: err.message };
    throw err;
  }
  return raw && parseDecoded(raw.value, topic, o);
}

/**
 * A value nested too deep to write back is refused here, before any service reads it: each of them stringifies
 * what it keeps, and a stack overflow there would be INTERNAL, the same record failing every restart.
 */
function parseDecoded<T>(value: unknown, topic: string, o: DecodeOptions<T>): Decoded<T> {
  // Bytes handed on as they are (ingest's OTLP input, parsed by its own parser) nest nothing, but the walk
  // visits every one of them as a key: several times the cost of decoding the OTLP request itself.
  if (!(value instanceof Uint8Array) && deeperThan(value))
    return { ok: false, reason: 'invalid', detail: TOO_DEEP };
  return o.parse(value, topic);
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
  const pre = precheck(msg, o);
  if (pre) return pre;
  let raw: unknown;
  try {
    raw = await o.codec.decode(msg.value!);
  } catch (err) {
    if (err instanceof DecodeError) return { ok: false, reason: err.reason, detail: err.message };
    throw err;
  }
  return parseDecoded(raw, topic, o);
}
