import { z } from 'zod';
import { id } from '../../../schemas/index.js';
import {
  commonEnvShape,
  crossChecked,
  envBool,
  int,
  refineCommon,
  topicName,
} from '../../../shared/config.js';
import { DEFAULT_MAX_PENDING_BYTES, DEFAULT_MAX_PENDING_SPANS } from './adapters/handler.js';
import { OTLP_ENCODINGS } from './adapters/otlp-decode.js';
import type { MapOptions } from './core/map.js';
import { DEFAULT_DECODE_LIMITS, MAX_SPANS_PER_MESSAGE_RANGE, type DecodeLimits } from './core/otlp.js';

export const ingestEnvSchema = crossChecked(
  z.object({
    ...commonEnvShape,
    INGEST_GROUP_ID: z.string().min(1).default('paver-ingest'),
    /** Where the Collector's Kafka exporter writes traces (its `traces::topic`, default `otlp_spans`). */
    INGEST_OTLP_TOPIC: topicName.default('otlp_spans'),
    /** The exporter's `traces::encoding`; `auto` tells otlp_json from otlp_proto per message. */
    INGEST_OTLP_ENCODING: z.enum(OTLP_ENCODINGS).default('auto'),
    INGEST_MAX_SPANS_PER_MESSAGE: int(
      MAX_SPANS_PER_MESSAGE_RANGE.min,
      MAX_SPANS_PER_MESSAGE_RANGE.max,
    ).default(DEFAULT_DECODE_LIMITS.maxSpans),
    // The tenant_id of every event no span names one for: what the contract refuses here, every consumer refuses.
    INGEST_TENANT_ID: id.default('default'),
    INGEST_TENANT_ATTRIBUTE: z.string().min(1).max(256).default('paver.tenant_id'),
    INGEST_INCLUDE_PAYLOADS: envBool.default(true),
    INGEST_MAX_PAYLOAD_BYTES: int(0, 16 * 1024 * 1024).default(64 * 1024),
    /** How long tool spans wait in Redis for their agent span (and completed tasks are remembered). */
    INGEST_PENDING_TTL_MS: int(1000).default(6 * 3_600_000),
    /** Spans one trace may keep waiting for its agent span; more are dropped (and counted). */
    INGEST_MAX_PENDING_SPANS: int(1, 1_000_000).default(DEFAULT_MAX_PENDING_SPANS),
    /** Bytes of the spans one trace may keep waiting (per trace: each chunk reads its traces' hashes back whole). */
    INGEST_MAX_PENDING_BYTES: int(1024, 512 * 1024 * 1024).default(DEFAULT_MAX_PENDING_BYTES),
  }),
  (env, ctx) => refineCommon(env, ctx, { INGEST_OTLP_TOPIC: env.get('INGEST_OTLP_TOPIC') }),
);
export type IngestEnv = z.infer<typeof ingestEnvSchema>;

export const mapOptionsFromEnv = (env: IngestEnv): MapOptions => ({
  defaultTenant: env.INGEST_TENANT_ID,
  tenantAttribute: env.INGEST_TENANT_ATTRIBUTE,
  includePayloads: env.INGEST_INCLUDE_PAYLOADS,
  maxPayloadBytes: env.INGEST_MAX_PAYLOAD_BYTES,
});

export const decodeLimitsFromEnv = (env: IngestEnv): DecodeLimits => ({
  maxSpans: env.INGEST_MAX_SPANS_PER_MESSAGE,
  maxDepth: 16,
});
