import type { Codec } from '../../../shared/codec.js';
import { createCodec } from '../../../shared/codec.js';
import { EXIT_CONFIG, parseEnv } from '../../../shared/config.js';
import { errorMessage, type PaverError } from '../../../shared/errors.js';
import { createHttpServer } from '../../../shared/http.js';
import { createKafka } from '../../../shared/kafka/client.js';
import { createRunner } from '../../../shared/kafka/runner.js';
import { createSink } from '../../../shared/kafka/sink.js';
import { ensureTopics, paverTopics } from '../../../shared/kafka/topics.js';
import { createLogger } from '../../../shared/log.js';
import { createMetrics } from '../../../shared/metrics.js';
import { createRedis, redisReady } from '../../../shared/redis/client.js';
import type { ServiceSpec } from '../../../shared/service.js';
import { createIngestHandler, createIngestMetrics, otlpParser } from './adapters/handler.js';
import { RedisTraceStore } from './adapters/trace-store.js';
import { decodeLimitsFromEnv, ingestEnvSchema, mapOptionsFromEnv, type IngestEnv } from './config.js';

export const SERVICE_NAME = 'ingest';
export const DEFAULT_PORT = 9105;

/**
 * What tooling reads of every registered service (the deploy manifests' tests, say): the ServiceSpec fields
 * without `setup`, since `run` below wires its own runner. `inputTopics` names the one topic consumed, which
 * for the other services is only known inside their `setup`.
 */
export const service: Omit<ServiceSpec<IngestEnv, never>, 'setup'> & {
  inputTopics: (env: IngestEnv) => string[];
} = {
  name: SERVICE_NAME,
  envSchema: ingestEnvSchema,
  defaultPort: DEFAULT_PORT,
  groupId: (env) => env.INGEST_GROUP_ID,
  inputTopics: (env) => [env.INGEST_OTLP_TOPIC],
};

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
 * Same lifecycle as shared/service.ts runService (config → Redis/Kafka → topics → HTTP → runner, graceful
 * stop on SIGTERM/SIGINT), wired by hand only because runService always decodes input with the Paver codec.
 */
export async function run(rawEnv: NodeJS.ProcessEnv = process.env): Promise<number> {
  let env: IngestEnv;
  try {
    env = parseEnv(ingestEnvSchema, rawEnv);
  } catch (err) {
    process.stderr.write(`paver ${SERVICE_NAME}: ${errorMessage(err)}\n`);
    return EXIT_CONFIG;
  }
  const log = createLogger(SERVICE_NAME, env.LOG_LEVEL);
  const metrics = createMetrics(SERVICE_NAME);
  const ingestMetrics = createIngestMetrics(metrics.registry);
  const kafka = createKafka(env, log, `${env.KAFKA_CLIENT_ID}-${SERVICE_NAME}`);
  const redis = createRedis(env, log);
  const sink = createSink(kafka, createCodec(env), metrics);
  const store = new RedisTraceStore(redis, env.REDIS_KEY_PREFIX, env.INGEST_PENDING_TTL_MS);

  let resolveExit!: (code: number) => void;
  const exited = new Promise<number>((r) => (resolveExit = r));
  let shuttingDown: Promise<void> | null = null;
  let runner: ReturnType<typeof createRunner> | null = null;
  let http: ReturnType<typeof createHttpServer> | null = null;
  const shutdown = (code: number, why: string) => {
    shuttingDown ??= (async () => {
      log.info({ why }, 'shutting down');
      const timer = setTimeout(() => {
        log.error('shutdown timed out; exiting');
        resolveExit(1);
      }, env.PAVER_SHUTDOWN_TIMEOUT_MS);
      timer.unref();
      const step = async (name: string, fn: () => Promise<unknown> | undefined) => {
        try {
          await fn();
        } catch (err) {
          log.warn({ step: name, err: errorMessage(err) }, 'shutdown step failed');
        }
      };
      await step('consumer', () => runner?.stop());
      await step('producer', () => sink.disconnect());
      await step('http', () => http?.close());
      await step('redis', () => redis.quit());
      clearTimeout(timer);
      log.info('stopped');
      resolveExit(code);
    })();
  };
  const onSignal = (sig: NodeJS.Signals) => shutdown(0, sig);
  process.once('SIGTERM', onSignal);
  process.once('SIGINT', onSignal);
  const onFatal = (err: Error) => {
    log.fatal({ err: err.message, code: (err as PaverError).code }, 'fatal error');
    shutdown(1, 'fatal');
  };

  try {
    await redis
      .connect()
      .catch((err: Error) => log.warn({ err: err.message }, 'redis not reachable yet; will retry'));
    if (env.KAFKA_CREATE_TOPICS) {
      const admin = kafka.admin();
      await admin.connect();
      const created = await ensureTopics(admin, paverTopics(env, [{ topic: env.INGEST_OTLP_TOPIC }]), {
        partitions: env.KAFKA_TOPIC_PARTITIONS,
        replicationFactor: env.KAFKA_REPLICATION_FACTOR,
      });
      if (created.length) log.info({ created }, 'created topics');
      await admin.disconnect();
    }
    await sink.connect();
    runner = createRunner({
      service: SERVICE_NAME,
      groupId: env.INGEST_GROUP_ID,
      topics: [env.INGEST_OTLP_TOPIC],
      parse: otlpParser(env.INGEST_OTLP_ENCODING, decodeLimitsFromEnv(env), ingestMetrics),
      handler: createIngestHandler({
        store,
        sink,
        topic: env.PAVER_TOPIC_TOOL_CALLS,
        opts: mapOptionsFromEnv(env),
        metrics: ingestMetrics,
      }),
      ready: () => redisReady(redis),
      env,
      kafka,
      codec: rawBytes,
      sink,
      metrics,
      log,
      onFatal,
    });
    const r = runner;
    http = createHttpServer({
      registry: metrics.registry,
      log,
      readiness: [
        { name: 'kafka_consumer', check: () => r.isJoined() },
        { name: 'kafka_producer', check: () => sink.isConnected() },
        { name: 'redis', check: async () => redisReady(redis) && (await redis.ping()) === 'PONG' },
      ],
    });
    const bound = await http.listen(env.HTTP_PORT ?? DEFAULT_PORT, env.HTTP_HOST);
    log.info({ port: bound }, 'http listening (/metrics, /healthz, /readyz)');
    if (!shuttingDown) await runner.start();
    log.info({ topics: [env.INGEST_OTLP_TOPIC], groupId: env.INGEST_GROUP_ID }, 'consuming');
  } catch (err) {
    log.fatal({ err: errorMessage(err) }, 'start-up failed');
    shutdown(1, 'start-up failed');
  }
  const code = await exited;
  process.off('SIGTERM', onSignal);
  process.off('SIGINT', onSignal);
  return code;
}
