import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { Kafka, logLevel, type KafkaConfig, type SASLOptions, type logCreator } from 'kafkajs';
import type { CommonEnv } from '../config.js';
import type { Logger } from '../log.js';

/**
 * The messages of the protocol errors kafkajs retries itself (a leader moving, a coordinator loading, an election
 * under way). Read from kafkajs's own table (pinned version); if it moves, none are known and all stay errors.
 */
const RETRIED: ReadonlySet<string> = (() => {
  try {
    const { errorCodes } = createRequire(import.meta.url)('kafkajs/src/protocol/error.js') as {
      errorCodes: { message: string; retriable: boolean }[];
    };
    return new Set(errorCodes.filter((e) => e.retriable).map((e) => e.message));
  } catch {
    return new Set<string>();
  }
})();

/**
 * kafkajs's connection logs every error response at ERROR before its caller sees it. Two kinds are not errors:
 * - a CreateTopics answer of "already exists", the expected outcome when several services start at once and
 *   create the same topics: topic preparation decides (and fails the start itself when a topic is still missing);
 * - an answer kafkajs retries (a topic just created whose leader is not elected yet answers "not the leader" at
 *   start-up): if the retries run out, the caller gets the error and reports it.
 */
const decidedByCaller = (message: string, error: unknown): boolean =>
  /^Response /.test(message) &&
  ((/^Response CreateTopics\b/.test(message) && /Topic creation errors/.test(String(error))) ||
    RETRIED.has(String(error)));

/** kafkajs log lines routed into pino, so the process has one structured log stream. */
export function pinoLogCreator(log: Logger): logCreator {
  return () =>
    ({ level, log: entry }) => {
      const { message, ...extra } = entry;
      const fields = {
        kafka: extra.logger ?? 'kafkajs',
        broker: extra.broker,
        groupId: extra.groupId,
        error: extra.error,
      };
      if (level === logLevel.ERROR && decidedByCaller(message, extra.error)) log.debug(fields, message);
      else if (level === logLevel.ERROR) log.error(fields, message);
      else if (level === logLevel.WARN) log.warn(fields, message);
      else if (level === logLevel.INFO) log.debug(fields, message);
      else log.trace(fields, message);
    };
}

export function kafkaConfig(env: CommonEnv, log: Logger, clientId = env.KAFKA_CLIENT_ID): KafkaConfig {
  let sasl: SASLOptions | undefined;
  if (env.KAFKA_SASL_MECHANISM) {
    sasl = {
      mechanism: env.KAFKA_SASL_MECHANISM,
      username: env.KAFKA_SASL_USERNAME ?? '',
      password: env.KAFKA_SASL_PASSWORD ?? '',
    } as SASLOptions;
  }
  const ssl =
    // A CA file or a client certificate asks for TLS as plainly as KAFKA_SSL does: never dropped for plaintext.
    env.KAFKA_SSL || env.KAFKA_SSL_CA_FILE || env.KAFKA_SSL_CERT_FILE
      ? {
          rejectUnauthorized: env.KAFKA_SSL_REJECT_UNAUTHORIZED,
          ...(env.KAFKA_SSL_CA_FILE ? { ca: [readFileSync(env.KAFKA_SSL_CA_FILE, 'utf8')] } : {}),
          ...(env.KAFKA_SSL_CERT_FILE ? { cert: readFileSync(env.KAFKA_SSL_CERT_FILE, 'utf8') } : {}),
          ...(env.KAFKA_SSL_KEY_FILE ? { key: readFileSync(env.KAFKA_SSL_KEY_FILE, 'utf8') } : {}),
        }
      : undefined;
  // Allowed (a test cluster with a self-signed certificate), never silent: these settings undo what TLS is for.
  if (ssl && !env.KAFKA_SSL_REJECT_UNAUTHORIZED)
    log.warn(
      { setting: 'KAFKA_SSL_REJECT_UNAUTHORIZED' },
      "Kafka TLS does not check the broker's certificate: anyone between can read and change the traffic",
    );
  if (sasl && !ssl && env.KAFKA_SASL_MECHANISM === 'plain')
    log.warn(
      { setting: 'KAFKA_SASL_MECHANISM' },
      'SASL PLAIN without TLS (KAFKA_SSL) sends the Kafka password in clear',
    );
  return {
    clientId,
    brokers: env.KAFKA_BROKERS,
    ...(ssl ? { ssl } : {}),
    ...(sasl ? { sasl } : {}),
    connectionTimeout: 3_000,
    requestTimeout: 30_000,
    // Bounded: with no broker, kafkajs would otherwise retry forever (tulios/kafkajs#852, #1721).
    retry: { initialRetryTime: 300, retries: 8, maxRetryTime: 10_000 },
    logLevel: logLevel.INFO,
    logCreator: pinoLogCreator(log),
  };
}

export function createKafka(env: CommonEnv, log: Logger, clientId?: string): Kafka {
  return new Kafka(kafkaConfig(env, log, clientId));
}
