import type { Codec } from '../../../shared/codec.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { decodeMessage } from '../../../shared/kafka/decode.js';
import { replayOptions } from '../../../shared/kafka/replay.js';
import { createEpoch } from '../../../shared/redis/epoch.js';
import { offsetAtTimestamp, otlpReplay, PendingRecovery, warnOnShortRetention } from './adapters/recovery.js';
import {
  createIngestApply,
  createIngestHandler,
  createIngestMetrics,
  otlpParser,
  type OtlpMessage,
} from './adapters/handler.js';
import { ingestGlobalKeys, RedisTraceStore } from './adapters/trace-store.js';
import { decodeLimitsFromEnv, ingestEnvSchema, mapOptionsFromEnv, type IngestEnv } from './config.js';

export const SERVICE_NAME = 'ingest';
export const DEFAULT_PORT = 9105;

/**
 * The runner hands message values to the codec before the parser. OTLP messages are not Paver's JSON or
 * Confluent framing, so the consumer gets a pass-through codec and the OTLP parser sees the raw bytes; the
 * sink keeps the configured codec for the events it publishes.
 */
const rawBytes: Codec = {
  kind: 'json',
  encode: () => Promise.reject(new Error('the OTLP input codec never encodes')),
  decode: (buf) => Promise.resolve(buf),
};

/**
 * `inputTopics` is exported beside the spec for tooling (the deploy manifests' tests): it names the one topic
 * consumed, which for the other services is only known inside their `setup`.
 */
export const service: ServiceSpec<IngestEnv, OtlpMessage> & {
  inputTopics: (env: IngestEnv) => string[];
} = {
  name: SERVICE_NAME,
  envSchema: ingestEnvSchema,
  defaultPort: DEFAULT_PORT,
  groupId: (env) => env.INGEST_GROUP_ID,
  inputTopics: (env) => [env.INGEST_OTLP_TOPIC],
  async setup({ env, redis, sink, metrics, kafka, log }) {
    const ingestMetrics = createIngestMetrics(metrics.registry);
    for (const outcome of ['rebuilt', 'retried', 'stopped', 'failed'])
      ingestMetrics.rebuilds.inc({ outcome }, 0);
    const store = new RedisTraceStore(redis, env.REDIS_KEY_PREFIX, env.INGEST_PENDING_TTL_MS);
    const topic = env.INGEST_OTLP_TOPIC;
    const limits = decodeLimitsFromEnv(env);
    const deps = {
      store,
      sink,
      topic: env.PAVER_TOPIC_TOOL_CALLS,
      opts: mapOptionsFromEnv(env),
      metrics: ingestMetrics,
      maxPendingSpans: env.INGEST_MAX_PENDING_SPANS,
      maxPendingBytes: env.INGEST_MAX_PENDING_BYTES,
      maxOutputBytes: env.PAVER_MAX_OUTPUT_BYTES,
    };
    // A replay decodes as the live path does, without counting: its messages were counted when first read.
    const replayDecode = {
      codec: rawBytes,
      parse: otlpParser(env.INGEST_OTLP_ENCODING, limits),
      maxBytes: env.PAVER_MAX_MESSAGE_BYTES,
    };
    const recovery = new PendingRecovery({
      store,
      topic,
      epoch: createEpoch(redis, ingestGlobalKeys(env.REDIS_KEY_PREFIX).epoch),
      ttlMs: env.INGEST_PENDING_TTL_MS,
      offsetAt: offsetAtTimestamp(kafka, topic),
      replay: otlpReplay(replayOptions(kafka, env, topic, env.INGEST_GROUP_ID), async (m) => {
        const r = await decodeMessage(m, topic, replayDecode);
        return r.ok ? r.value.spans : null;
      }),
      apply: createIngestApply(deps),
      log,
      hooks: {
        started: () => ingestMetrics.rebuilding.inc(),
        finished: (_p, outcome, messages) => {
          ingestMetrics.rebuilding.dec();
          ingestMetrics.rebuilds.inc({ outcome });
          ingestMetrics.rebuildMessages.inc(messages);
        },
      },
    });
    return {
      inputTopics: [topic],
      extraTopics: [{ topic }],
      inputCodec: rawBytes,
      parse: otlpParser(env.INGEST_OTLP_ENCODING, limits, ingestMetrics),
      handler: createIngestHandler({ ...deps, recovery, log }),
      readiness: [{ name: 'ingest_state', check: () => !recovery.isRebuilding() }],
      // Said at start, not when Redis is lost: by then the spans retention removed are gone for good.
      start: () => warnOnShortRetention(kafka, topic, env.INGEST_PENDING_TTL_MS, log),
    };
  },
};

export const run = (env: NodeJS.ProcessEnv = process.env): Promise<number> => runService(service, env);
