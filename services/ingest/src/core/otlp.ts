import { setOwn } from '../../../../shared/core/own.js';
import { z } from 'zod';

/**
 * OTLP/JSON ExportTraceServiceRequest, as the Collector's `otlp_json` encoding and the OTLP file exporters
 * write it (lowerCamelCase keys, hex trace/span ids, enums as integers, 64-bit integers as strings). The
 * protobuf adapter turns `otlp_proto` into this same shape, so one parser serves both encodings.
 * Only the fields the mapping reads are checked; every other field is ignored.
 */
const hexId = (bytes: number) =>
  z
    .string()
    .regex(new RegExp(`^[0-9a-fA-F]{${bytes * 2}}$`), `expected ${bytes * 2} hex digits`)
    .transform((s) => s.toLowerCase());
// The proto3 JSON mapping writes 64-bit integers as strings but lets writers use numbers. Nanoseconds since
// 1970 are far above 2^53: the number parsed is off by up to 256 ns (1,700,000,000,021,000,000 reads as
// …020,999,936, a millisecond early once truncated), so a number is taken to the nearest microsecond, which
// gives back every time an SDK writes at microsecond precision or coarser.
const u64 = z
  .union([
    z.string().regex(/^\d{1,20}$/),
    z
      .number()
      .nonnegative()
      .max(2 ** 64)
      .refine(Number.isInteger, 'expected an integer'),
  ])
  .transform((v) => (typeof v === 'string' ? BigInt(v) : BigInt(Math.round(v / 1000)) * 1000n));
const keyValues = z.array(z.object({ key: z.string(), value: z.unknown().optional() })).optional();

const spanSchema = z.object({
  traceId: hexId(16),
  spanId: hexId(8),
  // Empty string, absent or all-zero bytes all mean "root span".
  parentSpanId: z.union([hexId(8), z.literal('')]).optional(),
  name: z.string().optional(),
  startTimeUnixNano: u64,
  endTimeUnixNano: u64.optional(),
  attributes: keyValues,
  status: z
    .object({ code: z.union([z.number().int(), z.string()]).optional(), message: z.string().optional() })
    .optional(),
});

export const otlpTraceRequest = z.object({
  resourceSpans: z
    .array(
      z.object({
        resource: z.object({ attributes: keyValues }).optional(),
        // Each span checked alone (spansFromRequest): one malformed span must not refuse the spans batched with it.
        scopeSpans: z.array(z.object({ spans: z.array(z.unknown()).optional() })).optional(),
      }),
    )
    .optional(),
});

export type SpanStatus = 'unset' | 'ok' | 'error';

/** One span with its attributes decoded to plain JS values (resource attributes kept apart). */
export interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string | null;
  name: string;
  startNs: bigint;
  endNs: bigint;
  status: SpanStatus;
  attributes: Record<string, unknown>;
  resource: Record<string, unknown>;
}

export interface DecodeLimits {
  /** Spans in one request; more is refused (a bounded amount of work per message). */
  maxSpans: number;
  /** Nesting depth of array/kvlist attribute values. */
  maxDepth: number;
}
export const DEFAULT_DECODE_LIMITS: DecodeLimits = { maxSpans: 10_000, maxDepth: 16 };
/**
 * The range of spans per request that INGEST_MAX_SPANS_PER_MESSAGE and `paver otel --max-spans-per-message` take
 * (default DEFAULT_DECODE_LIMITS.maxSpans): one bound, so the command and the service refuse the same requests.
 */
export const MAX_SPANS_PER_MESSAGE_RANGE = { min: 1, max: 1_000_000 } as const;

export class OtlpError extends Error {
  constructor(
    readonly reason: 'invalid' | 'oversize',
    message: string,
  ) {
    super(message);
    this.name = 'OtlpError';
  }
}

const ZERO_ID = /^0+$/;

/**
 * AnyValue → JS value. `kvlistValue` becomes an object, `arrayValue` an array, `bytesValue` stays base64
 * text and `intValue` a number (a string when it does not fit a double exactly).
 */
export function anyValue(v: unknown, depth: number, maxDepth: number): unknown {
  if (v === null || typeof v !== 'object') return undefined;
  if (depth > maxDepth) throw new OtlpError('invalid', `attribute values nested deeper than ${maxDepth}`);
  const o = v as Record<string, unknown>;
  if (typeof o.stringValue === 'string') return o.stringValue;
  if (typeof o.boolValue === 'boolean') return o.boolValue;
  if (o.intValue !== undefined) {
    const n = typeof o.intValue === 'string' ? Number(o.intValue) : o.intValue;
    if (typeof n !== 'number' || !Number.isFinite(n)) return undefined;
    return Number.isSafeInteger(n) ? n : String(o.intValue);
  }
  if (o.doubleValue !== undefined) {
    const n = Number(o.doubleValue);
    return Number.isFinite(n) ? n : undefined;
  }
  if (typeof o.bytesValue === 'string') return o.bytesValue;
  if (o.arrayValue && typeof o.arrayValue === 'object') {
    const values = (o.arrayValue as { values?: unknown }).values;
    return Array.isArray(values) ? values.map((x) => anyValue(x, depth + 1, maxDepth) ?? null) : [];
  }
  if (o.kvlistValue && typeof o.kvlistValue === 'object') {
    const values = (o.kvlistValue as { values?: unknown }).values;
    const out: Record<string, unknown> = {};
    if (Array.isArray(values))
      for (const kv of values as { key?: unknown; value?: unknown }[]) {
        if (typeof kv?.key === 'string') setOwn(out, kv.key, anyValue(kv.value, depth + 1, maxDepth) ?? null);
      }
    return out;
  }
  return undefined;
}

/**
 * An attribute value nested deeper than `DecodeLimits.maxDepth`, in place of the value: the mapping leaves it out
 * (a tool's arguments or result, with the reason `too_deep`), and the span and its request are kept. Thrown, it
 * refused the whole request: every span of every trace the Collector had batched with it was dead-lettered for
 * one deep tool result, which the conventions ask instrumentations to record structured.
 */
export const TOO_DEEP_VALUE: unique symbol = Symbol('attribute value nested too deep');

function attributes(kvs: { key: string; value?: unknown }[] | undefined, maxDepth: number) {
  const out: Record<string, unknown> = {};
  for (const kv of kvs ?? []) {
    let v: unknown;
    try {
      v = anyValue(kv.value, 0, maxDepth);
    } catch (err) {
      if (!(err instanceof OtlpError)) throw err;
      v = TOO_DEEP_VALUE;
    }
    // Keys are the producer's: a `__proto__` attribute must stay a key, not become the record's prototype.
    if (v !== undefined) setOwn(out, kv.key, v);
  }
  return out;
}

function statusOf(code: number | string | undefined): SpanStatus {
  if (code === 2 || code === 'STATUS_CODE_ERROR') return 'error';
  if (code === 1 || code === 'STATUS_CODE_OK') return 'ok';
  return 'unset';
}

/** Paths and zod messages only: never the offending values (they may carry tool payloads). */
const issues = (e: z.ZodError) =>
  e.issues
    .slice(0, 5)
    .map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`)
    .join('; ');

export interface RequestSpans {
  spans: OtlpSpan[];
  /**
   * Spans left out as malformed (ids not 16 and 8 bytes of hex, times not integers…), and what was wrong with the
   * first of them. They are left out alone: refusing the request for one of them dead-lettered every good span the
   * Collector had batched with it.
   */
  invalid: number;
  invalidDetail?: string;
}

/**
 * Validates an OTLP/JSON trace request and flattens it to spans, a malformed span left out and counted. Throws
 * OtlpError on a request that is not one (or over the bound).
 */
export function spansFromRequest(raw: unknown, limits: DecodeLimits = DEFAULT_DECODE_LIMITS): RequestSpans {
  const count = countSpans(raw);
  if (count > limits.maxSpans)
    throw new OtlpError('oversize', `${count} spans in one request > ${limits.maxSpans}`);
  const r = otlpTraceRequest.safeParse(raw);
  if (!r.success) {
    throw new OtlpError('invalid', `not an OTLP trace request: ${issues(r.error)}`);
  }
  const result: RequestSpans = { spans: [], invalid: 0 };
  const out = result.spans;
  for (const rs of r.data.resourceSpans ?? []) {
    const resource = attributes(rs.resource?.attributes, limits.maxDepth);
    for (const ss of rs.scopeSpans ?? [])
      for (const raw of ss.spans ?? []) {
        const span = spanSchema.safeParse(raw);
        if (!span.success) {
          result.invalid++;
          result.invalidDetail ??= issues(span.error);
          continue;
        }
        const s = span.data;
        out.push({
          traceId: s.traceId,
          spanId: s.spanId,
          parentSpanId: s.parentSpanId && !ZERO_ID.test(s.parentSpanId) ? s.parentSpanId : null,
          name: s.name ?? '',
          startNs: s.startTimeUnixNano,
          endNs: s.endTimeUnixNano ?? s.startTimeUnixNano,
          status: statusOf(s.status?.code),
          attributes: attributes(s.attributes, limits.maxDepth),
          resource,
        });
      }
  }
  return result;
}

function countSpans(raw: unknown): number {
  let n = 0;
  const rss = (raw as { resourceSpans?: unknown } | null)?.resourceSpans;
  if (!Array.isArray(rss)) return 0;
  for (const rs of rss) {
    const sss = (rs as { scopeSpans?: unknown } | null)?.scopeSpans;
    if (!Array.isArray(sss)) continue;
    for (const ss of sss) {
      const spans = (ss as { spans?: unknown } | null)?.spans;
      if (Array.isArray(spans)) n += spans.length;
    }
  }
  return n;
}
