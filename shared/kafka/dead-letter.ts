import { createHash } from 'node:crypto';
import type { IHeaders } from 'kafkajs';
import { DEAD_LETTER_REASONS, type DeadLetterReason, type DeadLetterRecord } from '../../schemas/index.js';
import { recordBatchBytes } from './requests.js';

/** The source message, as the runner holds it (kafkajs's KafkaMessage fits). */
export interface DeadLetterSource {
  topic: string;
  partition: number;
  offset: string;
  key: Buffer | null;
  value: Buffer | null;
  timestamp: string;
  /** The source message's headers (trace context, correlation ids): a replay of the dead letter needs them. */
  headers?: IHeaders | undefined;
}

export interface DeadLetterLimits {
  /** Original bytes are kept (base64) up to this size; beyond it only their size and hash. */
  maxOriginalBytes: number;
  /** Keys longer than this travel as a hash. */
  maxKeyBytes: number;
}

export interface DeadLetterMessage {
  key: Buffer | null;
  value: string;
  headers: IHeaders;
}

/**
 * Bytes of header names and values a dead letter carries over from its source at most. Beyond, it carries none
 * of them and `paver-dlq-headers-dropped` says how many there were: the record's size stays bounded.
 */
export const MAX_ORIGINAL_HEADER_BYTES = 8 * 1024;
// Paver's own headers describe this dead letter; a source's headers of the same names (a dead letter read
// back, say) would contradict them.
const OWN_HEADER = /^paver-(dlq|source)-/;

function originalHeaders(h: IHeaders | undefined): { kept: IHeaders; dropped: number } {
  const kept: IHeaders = {};
  // A header value may be null on the wire (Java's `new RecordHeader(name, null)`), and kafkajs reads it so,
  // whatever IHeaders says. kafkajs cannot write one back (it throws on sizing it), and before, sizing it here
  // threw a TypeError: the bad record's dead letter failed as a bug, the service stopped, and every restart met
  // the same record. Such values are left out and counted as dropped.
  let nulls = 0;
  for (const [name, v] of Object.entries(h ?? {})) {
    if (v === undefined || OWN_HEADER.test(name)) continue;
    const values = (Array.isArray(v) ? v : [v]) as (Buffer | string | null)[];
    const present = values.filter((x): x is Buffer | string => x !== null);
    nulls += values.length - present.length;
    if (present.length > 0) kept[name] = Array.isArray(v) ? present : present[0];
  }
  if (headerBytes(kept) <= MAX_ORIGINAL_HEADER_BYTES) return { kept, dropped: nulls };
  let dropped = nulls;
  for (const v of Object.values(kept)) dropped += Array.isArray(v) ? v.length : 1;
  return { kept: {}, dropped };
}

/** Bytes of a record's headers, names and values: what a produce request carries besides key and value. */
export function headerBytes(h: IHeaders): number {
  let n = 0;
  for (const [name, v] of Object.entries(h))
    if (v !== undefined)
      for (const x of Array.isArray(v) ? v : [v]) n += Buffer.byteLength(name) + Buffer.byteLength(x);
  return n;
}

/**
 * A record's size as the broker measures it against max.message.bytes when it goes alone (batch framing, key,
 * value and every header), uncompressed: what PAVER_MAX_OUTPUT_BYTES bounds. Exact for the uncompressed batches the
 * services send; a batch the producer or the topic's compression.type compresses is counted by the broker at its
 * compressed size, smaller for compressible records but larger, by the codec's framing, for incompressible ones. A null key or value takes the same
 * one byte as an empty one.
 */
export function messageBytes(m: {
  key?: Buffer | string | null | undefined;
  value: Buffer | string | null;
  headers?: IHeaders | undefined;
}): number {
  const headers: [number, number][] = [];
  for (const [name, v] of Object.entries(m.headers ?? {}))
    if (v !== undefined)
      for (const x of Array.isArray(v) ? v : [v])
        headers.push([Buffer.byteLength(name), Buffer.byteLength(x)]);
  return recordBatchBytes(
    m.key === null || m.key === undefined ? null : Buffer.byteLength(m.key),
    m.value === null ? 0 : Buffer.byteLength(m.value),
    headers,
  );
}

export const DETAIL_MAX = 4096;
/** Cut on a code point: a lone surrogate does not survive a JSON round trip in other languages. */
function cut(s: string, max: number): string {
  if (s.length <= max) return s;
  const code = s.charCodeAt(max - 1);
  return s.slice(0, code >= 0xd800 && code <= 0xdbff ? max - 1 : max);
}
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/**
 * Builds one dead-letter record: deterministic given `now`, no I/O. Its size is bounded by the limits (about
 * 4/3 of maxOriginalBytes plus 4/3 of maxKeyBytes plus 6 KiB), never by the size of the bad message, so a
 * huge message cannot produce a record the broker refuses.
 */
export function buildDeadLetter(
  service: string,
  src: DeadLetterSource,
  reason: DeadLetterReason,
  detail: string,
  limits: DeadLetterLimits,
  now: number,
): DeadLetterMessage {
  const keepKey = src.key !== null && src.key.length <= limits.maxKeyBytes;
  const size = src.value?.length ?? 0;
  const keepValue = src.value !== null && size <= limits.maxOriginalBytes;
  const body: DeadLetterRecord = {
    schema_version: 1,
    service,
    reason,
    detail: cut(detail, DETAIL_MAX),
    source: {
      topic: src.topic,
      partition: src.partition,
      offset: src.offset,
      key_b64: keepKey ? src.key!.toString('base64') : null,
      ...(src.key !== null && !keepKey ? { key_sha256: sha256(src.key) } : {}),
      timestamp: src.timestamp,
    },
    original_size: size,
    original_b64: keepValue ? src.value!.toString('base64') : null,
    ...(src.value !== null ? { original_sha256: sha256(src.value) } : {}),
    dead_lettered_at: now,
  };
  const originals = originalHeaders(src.headers);
  return {
    key: keepKey ? src.key : null,
    value: JSON.stringify(body),
    headers: {
      ...originals.kept,
      ...(originals.dropped ? { 'paver-dlq-headers-dropped': String(originals.dropped) } : {}),
      'paver-dlq-reason': reason,
      'paver-dlq-service': service,
      'paver-source-topic': src.topic,
      'paver-source-partition': String(src.partition),
      'paver-source-offset': src.offset,
    },
  };
}

/**
 * The same record without the original bytes and headers: the fallback when the broker refuses the full one.
 */
export function withoutOriginal(
  service: string,
  src: DeadLetterSource,
  reason: DeadLetterReason,
  detail: string,
  now: number,
): DeadLetterMessage {
  return buildDeadLetter(
    service,
    { ...src, headers: undefined },
    reason,
    detail,
    { maxOriginalBytes: -1, maxKeyBytes: -1 },
    now,
  );
}

/** Longest service name a runner takes, of [a-zA-Z0-9._-] (Paver's own are under 16): dead letters carry it twice. */
export const MAX_SERVICE_NAME = 64;

/**
 * The largest hash-only dead letter (`withoutOriginal`) as the broker counts it, headers included: the smallest
 * PAVER_MAX_OUTPUT_BYTES at which every dead letter fits (a larger one goes hash-only, and this one must go).
 * Built from the worst of each field: a detail of DETAIL_MAX code units each written as a six-byte JSON escape (a
 * detail may name a path through the payload's own keys), a topic name of Kafka's 249 characters (in the record
 * and in a header), the longest service name and reason, the largest partition, offset, timestamp, size and time.
 */
export const HASH_ONLY_DEAD_LETTER_MAX_BYTES = ((): number => {
  const longest = (a: readonly string[]) => a.reduce((x, y) => (y.length > x.length ? y : x));
  const m = withoutOriginal(
    's'.repeat(MAX_SERVICE_NAME),
    {
      topic: 't'.repeat(249),
      partition: 2 ** 31 - 1,
      offset: String(2n ** 63n - 1n),
      key: Buffer.alloc(1),
      value: Buffer.alloc(1),
      timestamp: String(-(2n ** 63n)),
    },
    longest(DEAD_LETTER_REASONS) as DeadLetterReason,
    '\u0001'.repeat(DETAIL_MAX),
    8.64e15, // the latest time a Date holds
  );
  // The size of a one-byte value written as the largest a message's could be.
  const value = m.value.replace('"original_size":1,', `"original_size":${Number.MAX_SAFE_INTEGER},`);
  if (value === m.value) throw new Error('dead letter bound: original_size not found');
  return messageBytes({ ...m, value });
})();

/** A broker refusal that no retry can change: the record (or the request) is over the broker's limit. */
export function isTooLarge(err: unknown): boolean {
  for (
    let e = err as { type?: unknown; message?: unknown; cause?: unknown } | undefined, i = 0;
    e && i < 5;
    i++
  ) {
    if (e.type === 'MESSAGE_TOO_LARGE' || e.type === 'RECORD_LIST_TOO_LARGE') return true;
    if (typeof e.message === 'string' && /larger than the max message size/i.test(e.message)) return true;
    e = e.cause as typeof e;
  }
  return false;
}
