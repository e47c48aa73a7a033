import type { Codec } from '../../../shared/codec.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import {
  createIngestHandler,
  createIngestMetrics,
  otlpParser,
  type OtlpMessage,
} from './adapters/handler.js';
import { RedisTraceStore } from './adapters/trace-store.js';
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
  async setup({ env, redis, sink, metrics }) {
    const ingestMetrics = createIngestMetrics(metrics.registry);
    const store = new RedisTraceStore(redis, env.REDIS_KEY_PREFIX, env.INGEST_PENDING_TTL_MS);
    return {
      inputTopics: [env.INGEST_OTLP_TOPIC],
      extraTopics: [{ topic: env.INGEST_OTLP_TOPIC }],
      inputCodec: rawBytes,
      parse: otlpParser(env.INGEST_OTLP_ENCODING, decodeLimitsFromEnv(env), ingestMetrics),
      handler: createIngestHandler({
        store,
        sink,
        topic: env.PAVER_TOPIC_TOOL_CALLS,
        opts: mapOptionsFromEnv(env),
        metrics: ingestMetrics,
        maxPendingSpans: env.INGEST_MAX_PENDING_SPANS,
      }),
    };
  },
};

export const run = (env: NodeJS.ProcessEnv = process.env): Promise<number> => runService(service, env);
