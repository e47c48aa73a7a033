import protobuf from 'protobufjs';
import type { DeadLetterReason } from '../../../../schemas/index.js';
import { errorMessage } from '../../../../shared/errors.js';
import { OtlpError, spansFromRequest, type DecodeLimits, type OtlpSpan } from '../core/otlp.js';

export const OTLP_ENCODINGS = ['auto', 'otlp_json', 'otlp_proto'] as const;
export type OtlpEncoding = (typeof OTLP_ENCODINGS)[number];

/**
 * The subset of opentelemetry/proto/collector/trace/v1 (ExportTraceServiceRequest) the mapping reads, with
 * the field numbers of the OTLP .proto files. Fields left out (events, links, scope, flags…) are skipped by
 * the decoder like any unknown field. Names are lowerCamelCase so the decoded object has the OTLP/JSON shape.
 */
const root = protobuf.Root.fromJSON({
  nested: {
    otlp: {
      nested: {
        ExportTraceServiceRequest: {
          fields: { resourceSpans: { rule: 'repeated', type: 'ResourceSpans', id: 1 } },
        },
        ResourceSpans: {
          fields: {
            resource: { type: 'Resource', id: 1 },
            scopeSpans: { rule: 'repeated', type: 'ScopeSpans', id: 2 },
          },
        },
        Resource: { fields: { attributes: { rule: 'repeated', type: 'KeyValue', id: 1 } } },
        ScopeSpans: { fields: { spans: { rule: 'repeated', type: 'Span', id: 2 } } },
        Span: {
          fields: {
            traceId: { type: 'bytes', id: 1 },
            spanId: { type: 'bytes', id: 2 },
            parentSpanId: { type: 'bytes', id: 4 },
            name: { type: 'string', id: 5 },
            startTimeUnixNano: { type: 'fixed64', id: 7 },
            endTimeUnixNano: { type: 'fixed64', id: 8 },
            attributes: { rule: 'repeated', type: 'KeyValue', id: 9 },
            status: { type: 'Status', id: 15 },
          },
        },
        // StatusCode is an enum on the wire, i.e. a varint: int32 reads it the same.
        Status: { fields: { message: { type: 'string', id: 2 }, code: { type: 'int32', id: 3 } } },
        KeyValue: { fields: { key: { type: 'string', id: 1 }, value: { type: 'AnyValue', id: 2 } } },
        AnyValue: {
          oneofs: {
            value: {
              oneof: [
                'stringValue',
                'boolValue',
                'intValue',
                'doubleValue',
                'arrayValue',
                'kvlistValue',
                'bytesValue',
              ],
            },
          },
          fields: {
            stringValue: { type: 'string', id: 1 },
            boolValue: { type: 'bool', id: 2 },
            intValue: { type: 'int64', id: 3 },
            doubleValue: { type: 'double', id: 4 },
            arrayValue: { type: 'ArrayValue', id: 5 },
            kvlistValue: { type: 'KeyValueList', id: 6 },
            bytesValue: { type: 'bytes', id: 7 },
          },
        },
        ArrayValue: { fields: { values: { rule: 'repeated', type: 'AnyValue', id: 1 } } },
        KeyValueList: { fields: { values: { rule: 'repeated', type: 'KeyValue', id: 1 } } },
      },
    },
  },
});
const Request = root.lookupType('otlp.ExportTraceServiceRequest');

const b64ToHex = (v: unknown) => (typeof v === 'string' ? Buffer.from(v, 'base64').toString('hex') : v);

/** OTLP protobuf bytes → the OTLP/JSON object shape (ids as hex, 64-bit integers as decimal strings). */
export function protoToJsonShape(buf: Uint8Array): unknown {
  const msg = Request.decode(buf);
  const obj = Request.toObject(msg, { longs: String, bytes: String, enums: Number, defaults: false });
  for (const rs of (obj.resourceSpans ?? []) as { scopeSpans?: { spans?: Record<string, unknown>[] }[] }[])
    for (const ss of rs.scopeSpans ?? [])
      for (const s of ss.spans ?? []) {
        s.traceId = b64ToHex(s.traceId);
        s.spanId = b64ToHex(s.spanId);
        if (s.parentSpanId !== undefined) s.parentSpanId = b64ToHex(s.parentSpanId);
      }
  return obj;
}

/** JSON text starts with `{` after optional whitespace; an OTLP protobuf request starts with tag 0x0A. */
export function looksLikeJson(buf: Uint8Array): boolean {
  for (const b of buf) {
    if (b === 0x20 || b === 0x09 || b === 0x0a || b === 0x0d) continue;
    return b === 0x7b;
  }
  return false;
}

export type DecodeResult =
  | {
      ok: true;
      spans: OtlpSpan[];
      /** Spans left out as malformed: the rest of the request is kept. */
      invalid: number;
      encoding: 'otlp_json' | 'otlp_proto';
    }
  | { ok: false; reason: DeadLetterReason; detail: string; encoding: 'otlp_json' | 'otlp_proto' };

/** One Kafka message value → spans. Details name the problem, never the payload's content. */
export function decodeOtlp(buf: Uint8Array, encoding: OtlpEncoding, limits: DecodeLimits): DecodeResult {
  const text = () => Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength).toString('utf8');
  let enc: 'otlp_json' | 'otlp_proto' = encoding === 'otlp_proto' ? 'otlp_proto' : 'otlp_json';
  let raw: unknown;
  try {
    if (encoding === 'otlp_json') raw = JSON.parse(text());
    else if (encoding === 'otlp_proto') raw = protoToJsonShape(buf);
    else {
      // 0x0A is both a JSON newline and the first protobuf tag: JSON is tried first, protobuf on failure.
      let parsed = false;
      if (looksLikeJson(buf)) {
        try {
          raw = JSON.parse(text());
          parsed = true;
        } catch {
          // not JSON after all
        }
      }
      if (!parsed) {
        enc = 'otlp_proto';
        raw = protoToJsonShape(buf);
      }
    }
  } catch (err) {
    const why =
      enc === 'otlp_json' ? 'not valid JSON' : `not an OTLP protobuf request (${errorMessage(err)})`;
    return { ok: false, reason: 'undecodable', detail: why, encoding: enc };
  }
  if (enc === 'otlp_json' && (raw === null || typeof raw !== 'object' || !('resourceSpans' in raw)))
    return {
      ok: false,
      reason: 'invalid',
      detail: 'not an OTLP trace request: no resourceSpans',
      encoding: enc,
    };
  // The protobuf decoder skips unknown fields, so random bytes or a message of another type read as a request with
  // no spans, taken silently. Only 0 bytes is the empty request (proto3 writes nothing for it).
  if (enc === 'otlp_proto' && buf.byteLength > 0 && !('resourceSpans' in (raw as object)))
    return {
      ok: false,
      reason: 'invalid',
      detail: 'not an OTLP trace request: no resourceSpans field (1) in a non-empty protobuf message',
      encoding: enc,
    };
  try {
    const { spans, invalid } = spansFromRequest(raw, limits);
    return { ok: true, spans, invalid, encoding: enc };
  } catch (err) {
    if (err instanceof OtlpError)
      return { ok: false, reason: err.reason, detail: err.message, encoding: enc };
    return { ok: false, reason: 'invalid', detail: errorMessage(err), encoding: enc };
  }
}
