import { readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { z } from 'zod';
import { SERVICES } from '../../cli/services.js';
import {
  commonEnvSchema,
  crossChecked,
  misspeltVariables,
  parseEnv,
  refineCommon,
} from '../../shared/config.js';
import { kafkaConfig } from '../../shared/kafka/client.js';
import { HASH_ONLY_DEAD_LETTER_MAX_BYTES } from '../../shared/kafka/dead-letter.js';
import { createRedis } from '../../shared/redis/client.js';
import { silentLogger } from '../../shared/log.js';
import { autoseqEnvSchema } from '../../services/autoseq/src/config.js';
import { detectorEnvSchema } from '../../services/detector/src/config.js';
import { flowsEnvSchema, offlineEnv, policyFileV1 } from '../../services/flows/src/config.js';
import { ingestEnvSchema } from '../../services/ingest/src/config.js';
import { sequencerEnvSchema } from '../../services/sequencer/src/config.js';

const schema = crossChecked(commonEnvSchema, refineCommon);
const base = { KAFKA_BROKERS: 'k:9092', REDIS_URL: 'redis://r:6379' };
/** The CONFIG_INVALID message for an environment (fails the test if it is accepted). */
function refused(env: Record<string, string>, by: z.ZodType = schema): string {
  try {
    parseEnv(by, { ...base, ...env });
  } catch (err) {
    expect((err as { code?: string }).code).toBe('CONFIG_INVALID');
    return (err as Error).message;
  }
  throw new Error(`accepted: ${Object.keys(env).join(', ')}`);
}

describe('security settings that would be silently ignored are configuration errors', () => {
  it('SASL credentials without a mechanism', () => {
    // Before, the credentials were dropped and the client connected without authenticating.
    const m = refused({ KAFKA_SASL_USERNAME: 'svc', KAFKA_SASL_PASSWORD: 'hunter2-secret' });
    expect(m).toContain('KAFKA_SASL_MECHANISM');
    expect(m).not.toContain('hunter2');
  });

  it('schema registry credentials without a user, or without the registry', () => {
    // Before, a password alone was not sent, and credentials without SCHEMA_REGISTRY_URL left outputs plain JSON.
    const url = 'https://registry:8081';
    const alone = refused({ SCHEMA_REGISTRY_URL: url, SCHEMA_REGISTRY_PASSWORD: 'hunter2-secret' });
    expect(alone).toContain('SCHEMA_REGISTRY_USERNAME: required with SCHEMA_REGISTRY_PASSWORD');
    expect(alone).not.toContain('hunter2');
    const noUrl = refused({ SCHEMA_REGISTRY_USERNAME: 'svc', SCHEMA_REGISTRY_PASSWORD: 'hunter2-secret' });
    expect(noUrl).toContain('SCHEMA_REGISTRY_URL: required with');
    expect(noUrl).not.toContain('hunter2');
    expect(() =>
      parseEnv(schema, {
        ...base,
        SCHEMA_REGISTRY_URL: url,
        SCHEMA_REGISTRY_USERNAME: 'svc',
        SCHEMA_REGISTRY_PASSWORD: 'x',
      }),
    ).not.toThrow();
  });

  it('a Redis user without a password', () => {
    // ioredis sends no AUTH without a password: the connection ran as the default user.
    expect(refused({ REDIS_USERNAME: 'paver' })).toContain('REDIS_PASSWORD');
    expect(() => parseEnv(schema, { ...base, REDIS_USERNAME: 'paver', REDIS_PASSWORD: 'x' })).not.toThrow();
    expect(() =>
      parseEnv(schema, { ...base, REDIS_URL: 'redis://paver:x@r:6379', REDIS_USERNAME: 'paver' }),
    ).not.toThrow();
  });

  it('a REDIS_URL whose password is badly percent-encoded names the variable, not the password', () => {
    // Before, it passed and the Redis client threw "URI malformed" at start-up: exit 1, no variable named.
    const m = refused({ REDIS_URL: 'redis://:p%zz-hunter2-secret@r:6379' });
    expect(m).toContain('REDIS_URL');
    expect(m).not.toContain('hunter2');
  });

  it('a certificate check turned off where no TLS is configured', () => {
    // Before, `false` was dropped without a word: the client spoke plaintext to what is meant to be a TLS
    // listener, and the start failed later on timeouts (Kafka) or never became ready (Redis), naming nothing.
    expect(refused({ KAFKA_SSL_REJECT_UNAUTHORIZED: 'false' })).toContain('KAFKA_SSL:');
    expect(refused({ REDIS_TLS_REJECT_UNAUTHORIZED: 'false' })).toContain('REDIS_URL:');
    // With TLS on, by whichever setting, it is taken (and warned about at start-up).
    for (const tls of [{ KAFKA_SSL: 'true' }, { KAFKA_SSL_CA_FILE: 'package.json' }])
      expect(() =>
        parseEnv(schema, { ...base, ...tls, KAFKA_SSL_REJECT_UNAUTHORIZED: 'false' }),
      ).not.toThrow();
    for (const tls of [{ REDIS_URL: 'rediss://r:6380' }, { REDIS_TLS_CA_FILE: 'package.json' }])
      expect(() =>
        parseEnv(schema, { ...base, ...tls, REDIS_TLS_REJECT_UNAUTHORIZED: 'false' }),
      ).not.toThrow();
  });

  it('a client certificate turns TLS on, like a CA file', () => {
    const cert = join(tmpdir(), `cert-${process.pid}.pem`);
    const key = join(tmpdir(), `key-${process.pid}.pem`);
    writeFileSync(cert, 'CERT');
    writeFileSync(key, 'KEY');
    // Before, without KAFKA_SSL=true the certificate was dropped and the client connected in plaintext.
    const env = parseEnv(schema, { ...base, KAFKA_SSL_CERT_FILE: cert, KAFKA_SSL_KEY_FILE: key });
    expect(kafkaConfig(env, silentLogger()).ssl).toMatchObject({ cert: 'CERT', key: 'KEY' });
  });
});

describe('security settings that weaken TLS are said at start-up', () => {
  const warnings = () => {
    const said: string[] = [];
    const log = silentLogger();
    log.warn = ((fields: unknown, msg?: string) => said.push(String(msg ?? fields))) as typeof log.warn;
    return { said, log };
  };

  it('a broker certificate not checked, SASL PLAIN in clear, a Redis certificate not checked', () => {
    const k = warnings();
    kafkaConfig(
      parseEnv(schema, { ...base, KAFKA_SSL: 'true', KAFKA_SSL_REJECT_UNAUTHORIZED: 'false' }),
      k.log,
    );
    expect(k.said.join('\n')).toContain("does not check the broker's certificate");
    const p = warnings();
    kafkaConfig(
      parseEnv(schema, {
        ...base,
        KAFKA_SASL_MECHANISM: 'plain',
        KAFKA_SASL_USERNAME: 'svc',
        KAFKA_SASL_PASSWORD: 'hunter2-secret',
      }),
      p.log,
    );
    expect(p.said.join('\n')).toContain('in clear');
    expect(p.said.join('\n')).not.toContain('hunter2');
    const r = warnings();
    const redis = createRedis(
      parseEnv(schema, { ...base, REDIS_URL: 'rediss://r:6380', REDIS_TLS_REJECT_UNAUTHORIZED: 'false' }),
      r.log,
    );
    redis.disconnect();
    expect(r.said.join('\n')).toContain("does not check the server's certificate");
    const quiet = warnings();
    kafkaConfig(parseEnv(schema, { ...base, KAFKA_SSL: 'true' }), quiet.log);
    createRedis(parseEnv(schema, { ...base, REDIS_URL: 'rediss://r:6380' }), quiet.log).disconnect();
    expect(quiet.said).toEqual([]);
  });
});

describe('REDIS_COMMAND_TIMEOUT_MS', () => {
  it('defaults to 5 s, reaches the Redis client, and refuses values that are not a sane deadline', () => {
    expect(parseEnv(schema, base).REDIS_COMMAND_TIMEOUT_MS).toBe(5_000);
    const redis = createRedis(
      parseEnv(schema, { ...base, REDIS_COMMAND_TIMEOUT_MS: '1500' }),
      silentLogger(),
    );
    expect(redis.options.commandTimeout).toBe(1_500);
    redis.disconnect();
    for (const bad of ['0', '-1', 'soon', '1.5'])
      expect(refused({ REDIS_COMMAND_TIMEOUT_MS: bad })).toContain('REDIS_COMMAND_TIMEOUT_MS');
  });
});

describe('KAFKA_BROKERS', () => {
  it('refuses a scheme, an IPv6 literal and a port out of range, naming the variable and what it takes', () => {
    // Before, each passed; kafkajs split the address at ':' and dialled host "PLAINTEXT" (or "["), port NaN.
    expect(refused({ KAFKA_BROKERS: 'PLAINTEXT://kafka:9092' })).toMatch(
      /KAFKA_BROKERS.*host:port without a scheme/,
    );
    expect(refused({ KAFKA_BROKERS: 'k1:9092,SASL_SSL://k2:9093' })).toMatch(/KAFKA_BROKERS.*scheme/);
    expect(refused({ KAFKA_BROKERS: '[::1]:9092' })).toMatch(/KAFKA_BROKERS.*IPv6/);
    for (const bad of ['k:0', 'k:99999', 'k:65536'])
      expect(refused({ KAFKA_BROKERS: bad })).toMatch(/KAFKA_BROKERS.*port from 1 to 65535/);
    expect(parseEnv(schema, { ...base, KAFKA_BROKERS: 'k1:9092, 10.0.0.2:65535' }).KAFKA_BROKERS).toEqual([
      'k1:9092',
      '10.0.0.2:65535',
    ]);
  });
});

describe('REDIS_URL', () => {
  it('refuses no host and a path that is not a database number, without quoting the URL', () => {
    // Before, both passed: ioredis dialled localhost, and parsed /paver as database NaN, so selected 0.
    const noHost = refused({ REDIS_URL: 'redis:///0' });
    expect(noHost).toMatch(/REDIS_URL: has no host/);
    for (const bad of ['redis://:hunter2-secret@r:6379/paver', 'rediss://r:6380/1/', 'redis://r/db1']) {
      const m = refused({ REDIS_URL: bad });
      expect(m).toMatch(/REDIS_URL: its path must be a database number/);
      expect(m).not.toContain('hunter2');
    }
    for (const good of ['redis://r', 'redis://r/', 'redis://r:6379/0', 'rediss://u:p@r:6380/15'])
      expect(parseEnv(schema, { ...base, REDIS_URL: good }).REDIS_URL).toBe(good);
  });
});

describe('topic variables', () => {
  it('refuse . and .., which Kafka refuses as topic names', () => {
    // Before, both passed and topic creation failed at start-up (exit 1, no variable named).
    for (const bad of ['.', '..'])
      expect(refused({ PAVER_TOPIC_DEAD_LETTERS: bad })).toMatch(
        /PAVER_TOPIC_DEAD_LETTERS: .*not \. or \.\./,
      );
    expect(parseEnv(schema, { ...base, PAVER_TOPIC_DEAD_LETTERS: '...' }).PAVER_TOPIC_DEAD_LETTERS).toBe(
      '...',
    );
  });

  it('name one topic per role, in every service', () => {
    // Before, each passed: dead letters written to the input topic were read back and dead-lettered for ever,
    // a state copy shared with another topic was restored from records of another contract.
    const cases: [z.ZodType, string, string][] = [
      [schema, 'PAVER_TOPIC_DEAD_LETTERS', 'paver.tool-calls.v1'],
      [detectorEnvSchema, 'DETECTOR_TOPIC_CHECKPOINTS', 'paver.flow-candidates.v1'],
      [autoseqEnvSchema, 'AUTOSEQ_RULES_TOPIC', 'paver.next-actions.v1'],
      [autoseqEnvSchema, 'PAVER_TOPIC_TOOL_CATALOG', 'paver.autoseq-rules.v1'],
      [sequencerEnvSchema, 'SEQUENCER_STATE_TOPIC', 'paver.sequence-state.v1'],
      [sequencerEnvSchema, 'PAVER_TOPIC_ORCHESTRATION', 'paver.sequencer-sessions.v1'],
      [flowsEnvSchema, 'FLOWS_STATE_TOPIC', 'paver.flows.v1'],
      [ingestEnvSchema, 'INGEST_OTLP_TOPIC', 'paver.tool-calls.v1'],
    ];
    for (const [by, key, topic] of cases)
      expect(refused({ [key]: topic }, by)).toMatch(
        new RegExp(`: names the same topic as [A-Z_]+ \\(${topic}\\)`),
      );
    expect(refused({ PAVER_TOPIC_FLOW_SELECTIONS: 'paver.flows.v1.state' }, flowsEnvSchema)).toContain(
      'FLOWS_STATE_TOPIC: names the same topic as PAVER_TOPIC_FLOW_SELECTIONS',
    );
    for (const by of [
      schema,
      detectorEnvSchema,
      autoseqEnvSchema,
      sequencerEnvSchema,
      flowsEnvSchema,
      ingestEnvSchema,
    ])
      expect(() => parseEnv(by, base)).not.toThrow();
  });

  it("refuse flows' derived state topic when it would pass Kafka's length", () => {
    const long = 'f'.repeat(245);
    expect(refused({ PAVER_TOPIC_FLOWS: long }, flowsEnvSchema)).toMatch(/FLOWS_STATE_TOPIC: unset, .*249/);
    expect(() =>
      parseEnv(flowsEnvSchema, { ...base, PAVER_TOPIC_FLOWS: long, FLOWS_STATE_TOPIC: 'flows-state' }),
    ).not.toThrow();
  });
});

describe('PAVER_RETRY_INITIAL_MS', () => {
  it('above PAVER_RETRY_MAX_MS is refused, naming both', () => {
    // Before, it passed and every wait was cut to the maximum: the first wait asked for never happened.
    expect(refused({ PAVER_RETRY_INITIAL_MS: '10000' })).toMatch(
      /PAVER_RETRY_INITIAL_MS: must be ≤ PAVER_RETRY_MAX_MS \(5000\)/,
    );
    expect(() =>
      parseEnv(schema, { ...base, PAVER_RETRY_INITIAL_MS: '10000', PAVER_RETRY_MAX_MS: '60000' }),
    ).not.toThrow();
  });
});

describe('integer variables', () => {
  it('say the accepted range whatever is wrong with the value', () => {
    // Before: "expected number, received NaN" for 5s, "expected int, received number" for 1.5, no range.
    for (const bad of ['5s', '1.5', '0', '101'])
      expect(refused({ DETECTOR_MIN_LENGTH: bad }, detectorEnvSchema)).toContain(
        'DETECTOR_MIN_LENGTH: expected an integer from 1 to 100',
      );
    for (const bad of ['soon', '-1'])
      expect(refused({ DETECTOR_TASK_IDLE_MS: bad }, detectorEnvSchema)).toContain(
        'DETECTOR_TASK_IDLE_MS: expected an integer ≥ 1',
      );
    expect(refused({ KAFKA_SESSION_TIMEOUT_MS: '30s' })).toContain(
      'KAFKA_SESSION_TIMEOUT_MS: expected an integer from 6000 to 300000',
    );
  });
});

describe('PAVER_MAX_OUTPUT_BYTES', () => {
  it('is at least the largest dead letter without its original bytes, which goes whatever the limit: under it, a configuration error naming the variable', () => {
    const least = HASH_ONLY_DEAD_LETTER_MAX_BYTES;
    // About 25 KiB: a detail of 4,096 characters written as six-byte JSON escapes, a 249-character topic twice.
    expect(least).toBeGreaterThan(25_000);
    expect(least).toBeLessThan(27_000);
    // Before: anything from 1,024 was taken, and such a dead letter was over the limit the service held it to.
    for (const bad of ['1024', String(least - 1)])
      expect(refused({ PAVER_MAX_OUTPUT_BYTES: bad })).toContain(
        `PAVER_MAX_OUTPUT_BYTES: expected an integer from ${least} to ${50 * 1024 * 1024}`,
      );
    expect(parseEnv(schema, { ...base, PAVER_MAX_OUTPUT_BYTES: String(least) }).PAVER_MAX_OUTPUT_BYTES).toBe(
      least,
    );
  });
});

describe('Redis credentials and TLS reach the client as documented', () => {
  const optionsOf = (env: Record<string, string>) => {
    const redis = createRedis(parseEnv(schema, { ...base, ...env }), silentLogger());
    redis.disconnect();
    return redis.options;
  };

  it('REDIS_USERNAME and REDIS_PASSWORD override the URL', () => {
    // Before, ioredis took the URL's user and password first (later options never replace them): a rotated
    // REDIS_PASSWORD was ignored for the one in the URL, and with a user alone in the URL no password was sent.
    expect(optionsOf({ REDIS_URL: 'redis://:old@r:6379', REDIS_PASSWORD: 'new' }).password).toBe('new');
    expect(optionsOf({ REDIS_URL: 'redis://paver@r:6379', REDIS_PASSWORD: 'pw' })).toMatchObject({
      username: 'paver',
      password: 'pw',
    });
    expect(
      optionsOf({ REDIS_URL: 'redis://old:pw@r:6379', REDIS_USERNAME: 'paver', REDIS_PASSWORD: 'p:w@' }),
    ).toMatchObject({ username: 'paver', password: 'p:w@' });
    // The URL's own, percent-decoded, when nothing overrides them; its host, port and database stay.
    expect(optionsOf({ REDIS_URL: 'redis://us%3Aer:p%40ss@r:6390/3' })).toMatchObject({
      username: 'us:er',
      password: 'p@ss',
      host: 'r',
      port: 6390,
      db: 3,
    });
  });

  it('rediss:// and REDIS_TLS_CA_FILE turn TLS on with the CA and the certificate check', () => {
    const ca = join(tmpdir(), `redis-ca-${process.pid}.pem`);
    writeFileSync(ca, 'CA');
    expect(optionsOf({ REDIS_URL: 'rediss://r:6380' }).tls).toEqual({ rejectUnauthorized: true });
    expect(optionsOf({ REDIS_TLS_CA_FILE: ca, REDIS_TLS_REJECT_UNAUTHORIZED: 'false' }).tls).toEqual({
      rejectUnauthorized: false,
      ca: ['CA'],
    });
    expect(optionsOf({}).tls).toBeUndefined();
  });
});

describe('Kafka SASL and TLS reach kafkajs as documented', () => {
  it('mechanism, user and password; CA, certificate check', () => {
    const ca = join(tmpdir(), `kafka-ca-${process.pid}.pem`);
    writeFileSync(ca, 'KCA');
    const config = kafkaConfig(
      parseEnv(schema, {
        ...base,
        KAFKA_SSL: 'true',
        KAFKA_SSL_CA_FILE: ca,
        KAFKA_SASL_MECHANISM: 'scram-sha-512',
        KAFKA_SASL_USERNAME: 'svc',
        KAFKA_SASL_PASSWORD: 'pw',
      }),
      silentLogger(),
    );
    expect(config.sasl).toEqual({ mechanism: 'scram-sha-512', username: 'svc', password: 'pw' });
    expect(config.ssl).toEqual({ rejectUnauthorized: true, ca: ['KCA'] });
    // Kafka's own spelling (sasl.mechanism=SCRAM-SHA-512) is the same mechanism: it was refused.
    const upper = kafkaConfig(
      parseEnv(schema, {
        ...base,
        KAFKA_SASL_MECHANISM: 'SCRAM-SHA-512',
        KAFKA_SASL_USERNAME: 'svc',
        KAFKA_SASL_PASSWORD: 'pw',
      }),
      silentLogger(),
    );
    expect(upper.sasl).toEqual({ mechanism: 'scram-sha-512', username: 'svc', password: 'pw' });
    expect(() => parseEnv(schema, { ...base, KAFKA_SASL_MECHANISM: 'GSSAPI' })).toThrow(
      /KAFKA_SASL_MECHANISM/,
    );
    const plain = kafkaConfig(parseEnv(schema, base), silentLogger());
    expect(plain.ssl).toBeUndefined();
    expect(plain.sasl).toBeUndefined();
  });
});

describe('flows model endpoints', () => {
  it('an API key without its endpoint URL is refused, the key never printed', () => {
    // Before, it passed: with no URL there is no model, and every selection took the top-ranked candidate.
    for (const [key, url] of [
      ['FLOWS_CHAT_API_KEY', 'FLOWS_CHAT_URL'],
      ['FLOWS_EMBEDDINGS_API_KEY', 'FLOWS_EMBEDDINGS_URL'],
    ]) {
      const m = refused({ [key!]: 'sk-hunter2' }, flowsEnvSchema);
      expect(m).toContain(`${url}: required with ${key}`);
      expect(m).not.toContain('hunter2');
      expect(() =>
        parseEnv(flowsEnvSchema, { ...base, [key!]: 'sk', [url!]: 'https://api.openai.com/v1' }),
      ).not.toThrow();
    }
  });

  it('offline commands read FLOWS_* as the service does: one message naming each variable, VAR= as unset', () => {
    // Before, zod's own error reached the user as a JSON dump of issues, and FLOWS_CHAT_URL= was an invalid URL.
    let message = '';
    try {
      offlineEnv({ FLOWS_TOP_K: 'abc', FLOWS_PROMOTION: 'automatic' });
    } catch (err) {
      expect((err as { code?: string }).code).toBe('CONFIG_INVALID');
      message = (err as Error).message;
    }
    expect(message).toContain('FLOWS_TOP_K: expected an integer from 1 to 100');
    expect(message).toContain('FLOWS_PROMOTION: ');
    expect(message).not.toContain('"path"');
    expect(offlineEnv({ FLOWS_CHAT_URL: '', FLOWS_TOP_K: '4' }).FLOWS_TOP_K).toBe(4);
  });
});

describe('AUTOSEQ_LEARN_SCOPE_TTL_MS', () => {
  it('is 30 days unless set; 0 turns expiry off; a lifetime under a minute is refused, saying what it takes', () => {
    expect(autoseqEnvSchema.parse(base).AUTOSEQ_LEARN_SCOPE_TTL_MS).toBe(30 * 24 * 3_600_000);
    expect(
      autoseqEnvSchema.parse({ ...base, AUTOSEQ_LEARN_SCOPE_TTL_MS: '0' }).AUTOSEQ_LEARN_SCOPE_TTL_MS,
    ).toBe(0);
    expect(
      autoseqEnvSchema.parse({ ...base, AUTOSEQ_LEARN_SCOPE_TTL_MS: '60000' }).AUTOSEQ_LEARN_SCOPE_TTL_MS,
    ).toBe(60_000);
    expect(refused({ AUTOSEQ_LEARN_SCOPE_TTL_MS: '5000' }, autoseqEnvSchema)).toContain(
      'AUTOSEQ_LEARN_SCOPE_TTL_MS: expected 0 (never) or at least 60000',
    );
    expect(refused({ AUTOSEQ_LEARN_SCOPE_TTL_MS: 'forever' }, autoseqEnvSchema)).toContain(
      'AUTOSEQ_LEARN_SCOPE_TTL_MS: expected an integer',
    );
  });
});

describe('DETECTOR_SCOPE_TTL_MS', () => {
  it('is 30 days unless set; 0 turns retirement off; an idle time under a minute is refused, saying what it takes', () => {
    expect(detectorEnvSchema.parse(base).DETECTOR_SCOPE_TTL_MS).toBe(30 * 24 * 3_600_000);
    expect(detectorEnvSchema.parse({ ...base, DETECTOR_SCOPE_TTL_MS: '0' }).DETECTOR_SCOPE_TTL_MS).toBe(0);
    expect(detectorEnvSchema.parse({ ...base, DETECTOR_SCOPE_TTL_MS: '60000' }).DETECTOR_SCOPE_TTL_MS).toBe(
      60_000,
    );
    expect(refused({ DETECTOR_SCOPE_TTL_MS: '5000' }, detectorEnvSchema)).toContain(
      'DETECTOR_SCOPE_TTL_MS: expected 0 (never) or at least 60000',
    );
    expect(refused({ DETECTOR_SCOPE_TTL_MS: '-1' }, detectorEnvSchema)).toContain('DETECTOR_SCOPE_TTL_MS: ');
  });
});

describe('decimal, URL and prefix variables', () => {
  it('say what they take', () => {
    // Before: "expected number, received NaN", "Invalid URL", "must match pattern /^[a-zA-Z0-9_.:-]{1,64}$/".
    expect(refused({ AUTOSEQ_LEARN_MIN_PRECISION: 'high' }, autoseqEnvSchema)).toContain(
      'AUTOSEQ_LEARN_MIN_PRECISION: expected a number > 0 and < 1',
    );
    expect(refused({ AUTOSEQ_LEARN_MIN_PRECISION: '1' }, autoseqEnvSchema)).toContain('> 0 and < 1');
    expect(refused({ FLOWS_SHADOW_PRECISION: '90%' }, flowsEnvSchema)).toContain(
      'FLOWS_SHADOW_PRECISION: expected a number ≥ 0 and ≤ 1',
    );
    expect(refused({ FLOWS_SCORE_FLOOR: '-1' }, flowsEnvSchema)).toContain(
      'FLOWS_SCORE_FLOOR: expected a number ≥ 0',
    );
    expect(refused({ FLOWS_OUTCOME_FLOOR: 'none' }, flowsEnvSchema)).toContain(
      'FLOWS_OUTCOME_FLOOR: expected a number',
    );
    expect(refused({ FLOWS_CHAT_URL: 'api.openai.com/v1' }, flowsEnvSchema)).toContain(
      'FLOWS_CHAT_URL: expected an http:// or https:// URL',
    );
    expect(refused({ SCHEMA_REGISTRY_URL: 'registry:8081' })).toContain(
      'SCHEMA_REGISTRY_URL: expected an http:// or https:// URL',
    );
    expect(refused({ REDIS_KEY_PREFIX: 'paver:{prod}' })).toContain(
      'REDIS_KEY_PREFIX: expected 1 to 64 of [a-zA-Z0-9_.:-] (no braces, no spaces)',
    );
    expect(parseEnv(flowsEnvSchema, { ...base, FLOWS_OUTCOME_FLOOR: '-0.5' }).FLOWS_OUTCOME_FLOOR).toBe(-0.5);
  });
});

describe('DETECTOR_MIN_OCCURRENCES', () => {
  it('above DETECTOR_LOOKBACK is refused: no sequence could ever reach it', () => {
    // Before, it passed and the detector ran without ever publishing a candidate.
    expect(refused({ DETECTOR_LOOKBACK: '2' }, detectorEnvSchema)).toContain(
      'DETECTOR_MIN_OCCURRENCES: must be ≤ DETECTOR_LOOKBACK (2)',
    );
    expect(() =>
      parseEnv(detectorEnvSchema, { ...base, DETECTOR_LOOKBACK: '3', DETECTOR_MIN_OCCURRENCES: '3' }),
    ).not.toThrow();
  });
});

describe('DETECTOR_DONE_RETENTION_MS', () => {
  it('under DETECTOR_TASK_IDLE_MS is refused: a redelivered event of a task closed as idle would reopen it', () => {
    // Before, it passed, and a redelivery after a restart replaced a whole record with its fragment.
    expect(
      refused({ DETECTOR_TASK_IDLE_MS: '60000', DETECTOR_DONE_RETENTION_MS: '1000' }, detectorEnvSchema),
    ).toContain(
      'DETECTOR_DONE_RETENTION_MS: must be ≥ DETECTOR_TASK_IDLE_MS (60000): a redelivered event of a task closed as idle would reopen it',
    );
    expect(() =>
      parseEnv(detectorEnvSchema, {
        ...base,
        DETECTOR_TASK_IDLE_MS: '60000',
        DETECTOR_DONE_RETENTION_MS: '60000',
      }),
    ).not.toThrow();
  });
});

/** Every service's configuration schema, by service. */
const schemas = {
  detector: detectorEnvSchema,
  autoseq: autoseqEnvSchema,
  sequencer: sequencerEnvSchema,
  flows: flowsEnvSchema,
  ingest: ingestEnvSchema,
};

describe('misspelt variables', () => {
  const keysOf = (s: z.ZodType) => Object.keys((s as unknown as { shape: object }).shape);

  it('a near miss of one of the service’s own names is found, named with the one meant', () => {
    // Before, DETECTOR_MIN_LENGHT=5 was ignored and the detector ran with the default 3, without a word.
    expect(
      misspeltVariables(detectorEnvSchema, {
        DETECTOR_MIN_LENGHT: '5',
        REDIS_KEY_PREFX: 'x',
        LOG_LEVLE: 'debug',
        KAFKA_SASL_PASSWROD: 'hunter2',
      }),
    ).toEqual([
      { variable: 'DETECTOR_MIN_LENGHT', meant: 'DETECTOR_MIN_LENGTH' },
      { variable: 'REDIS_KEY_PREFX', meant: 'REDIS_KEY_PREFIX' },
      { variable: 'LOG_LEVLE', meant: 'LOG_LEVEL' },
      { variable: 'KAFKA_SASL_PASSWROD', meant: 'KAFKA_SASL_PASSWORD' },
    ]);
  });

  it('says nothing of what is not a near miss: other services’ settings, Kubernetes service links, the stack’s', () => {
    const every = Object.fromEntries(
      Object.values(schemas)
        .flatMap(keysOf)
        .map((k) => [k, 'x']),
    );
    const others = Object.fromEntries(
      [
        'HOME',
        'PATH',
        'HOSTNAME',
        'NODE_ENV',
        'NODE_OPTIONS',
        'HTTP_PROXY',
        'HTTPS_PROXY',
        'NO_PROXY',
        'KAFKA_HEAP_OPTS',
        'PAVER_CACHE_DIR',
        'PAVER_KAFKA_VERSION',
        'PAVER_DETECTOR_HTTP_PORT',
        'PAVER_DETECTOR_PORT',
        'PAVER_DETECTOR_SERVICE_HOST',
        'PAVER_DETECTOR_SERVICE_PORT',
        'REDIS_PORT',
        'REDIS_SERVICE_HOST',
        'REDIS_SERVICE_PORT',
        'KAFKA_PORT',
        'KAFKA_SERVICE_HOST',
        'KAFKA_SERVICE_PORT',
        'FLOWS_URL',
      ].map((k) => [k, 'x']),
    );
    for (const [name, schema] of Object.entries(schemas))
      expect(misspeltVariables(schema, { ...every, ...others }), name).toEqual([]);
  });
});

describe('INGEST_TENANT_ID', () => {
  it('takes what the contract takes as a tenant_id: every event no span names a tenant for carries it', () => {
    const base = { KAFKA_BROKERS: 'k:9092', REDIS_URL: 'redis://r:6379' };
    expect(parseEnv(ingestEnvSchema, { ...base, INGEST_TENANT_ID: 'acme' }).INGEST_TENANT_ID).toBe('acme');
    // Before: accepted, and every such event was then refused as invalid by the detector, autoseq and the sequencer.
    for (const bad of ['acme\tcorp', 'line\nbreak', 'x'.repeat(300)])
      expect(() => parseEnv(ingestEnvSchema, { ...base, INGEST_TENANT_ID: bad })).toThrow(/INGEST_TENANT_ID/);
  });
});

describe('INGEST_MAX_PENDING_BYTES', () => {
  it('bounds the bytes one trace keeps waiting: 32 MiB by default, 1024 to 512 MiB', () => {
    const base = { KAFKA_BROKERS: 'k:9092', REDIS_URL: 'redis://r:6379' };
    expect(parseEnv(ingestEnvSchema, base).INGEST_MAX_PENDING_BYTES).toBe(32 * 1024 * 1024);
    expect(
      parseEnv(ingestEnvSchema, { ...base, INGEST_MAX_PENDING_BYTES: '1024' }).INGEST_MAX_PENDING_BYTES,
    ).toBe(1024);
    for (const bad of ['0', '1023', String(512 * 1024 * 1024 + 1), 'x'])
      expect(() => parseEnv(ingestEnvSchema, { ...base, INGEST_MAX_PENDING_BYTES: bad })).toThrow(
        /INGEST_MAX_PENDING_BYTES/,
      );
  });
});

describe('one round of configuration errors', () => {
  it('a variable that fails its own parse leaves the cross-variable rules over the others running', () => {
    // Before, zod skipped every cross-variable rule once one variable failed: DETECTOR_LOOKBACK=abc hid the
    // retry bounds, the topic clash and the length bounds until it was fixed, and the user needed two rounds.
    const m = refused(
      {
        DETECTOR_LOOKBACK: 'abc',
        DETECTOR_MIN_OCCURRENCES: '500',
        DETECTOR_MIN_LENGTH: '5',
        DETECTOR_MAX_LENGTH: '3',
        PAVER_RETRY_INITIAL_MS: '10000',
        PAVER_TOPIC_DEAD_LETTERS: 'paver.tool-calls.v1',
        KAFKA_SASL_USERNAME: 'svc',
        KAFKA_SASL_PASSWORD: 'hunter2-secret',
      },
      detectorEnvSchema,
    );
    expect(m).toContain('DETECTOR_LOOKBACK: expected an integer');
    expect(m).toContain('PAVER_RETRY_INITIAL_MS: must be ≤ PAVER_RETRY_MAX_MS');
    expect(m).toContain('PAVER_TOPIC_DEAD_LETTERS: names the same topic as PAVER_TOPIC_TOOL_CALLS');
    expect(m).toContain('DETECTOR_MAX_LENGTH: must be ≥ DETECTOR_MIN_LENGTH');
    expect(m).toContain('KAFKA_SASL_MECHANISM: required with');
    // A rule over a variable that did not parse is left out: its value is not known.
    expect(m).not.toContain('DETECTOR_MIN_OCCURRENCES');
    expect(m).toMatch(/\(5 problem\(s\)\)/);
  });

  it('in every service, and a rule over a failed variable is skipped rather than guessed', () => {
    const cases: [z.ZodType, Record<string, string>, string][] = [
      [schema, { KAFKA_BROKERS: 'PLAINTEXT://k:9092' }, 'PAVER_RETRY_INITIAL_MS: must be'],
      [autoseqEnvSchema, { AUTOSEQ_LEARN_MAX_K: '0' }, 'PAVER_RETRY_INITIAL_MS: must be'],
      [sequencerEnvSchema, { SEQUENCER_SESSION_TTL_MS: 'x' }, 'PAVER_RETRY_INITIAL_MS: must be'],
      [ingestEnvSchema, { INGEST_MAX_PENDING_SPANS: 'x' }, 'PAVER_RETRY_INITIAL_MS: must be'],
      [flowsEnvSchema, { FLOWS_TOP_K: 'x', FLOWS_CHAT_API_KEY: 'k' }, 'FLOWS_CHAT_URL: required with'],
    ];
    for (const [by, env, expected] of cases)
      expect(refused({ PAVER_RETRY_INITIAL_MS: '10000', ...env }, by)).toContain(expected);
    // PAVER_RETRY_MAX_MS failed: whether the first wait is above it is not known, so nothing is said of it.
    const m = refused({ PAVER_RETRY_INITIAL_MS: '10000', PAVER_RETRY_MAX_MS: 'x' });
    expect(m).toContain('PAVER_RETRY_MAX_MS: expected an integer');
    expect(m).not.toContain('PAVER_RETRY_INITIAL_MS');
    // A mechanism that failed is not taken as unset (which would say it is required).
    expect(
      refused({ KAFKA_SASL_MECHANISM: 'gssapi', KAFKA_SASL_USERNAME: 'u', KAFKA_SASL_PASSWORD: 'p' }),
    ).not.toContain('required with');
  });
});

describe('HTTP_HOST', () => {
  it('refuses what is not a host name or IP address, naming the variable, and takes what Node binds', () => {
    // Before, each passed and the start failed at bind time on a name lookup: exit 1, no variable named.
    for (const bad of [
      'localhost:9101',
      'http://0.0.0.0',
      '[::1]',
      '0.0.0.0/0',
      'my host',
      '999.1.1.1',
      '-a',
    ])
      expect(refused({ HTTP_HOST: bad })).toMatch(/HTTP_HOST: expected (a host name|an IPv6)/);
    expect(refused({ HTTP_HOST: 'localhost:9101' })).toContain('the port is HTTP_PORT');
    for (const good of [
      '0.0.0.0',
      '::',
      '::1',
      '127.0.0.1',
      'localhost',
      'detector.paver.svc.cluster.local.',
    ])
      expect(parseEnv(schema, { ...base, HTTP_HOST: good }).HTTP_HOST).toBe(good);
  });
});

describe('topics Paver creates', () => {
  it('take the broker’s replication factor unless KAFKA_REPLICATION_FACTOR says otherwise', () => {
    // Before, the default was 1, which overrode the broker's default.replication.factor in a production cluster.
    expect(parseEnv(schema, base).KAFKA_REPLICATION_FACTOR).toBeUndefined();
    expect(parseEnv(schema, { ...base, KAFKA_REPLICATION_FACTOR: '3' }).KAFKA_REPLICATION_FACTOR).toBe(3);
  });
});

describe('the configuration tables of the READMEs', () => {
  /** Every variable a service reads, with its default ('required', or undefined when unset means unset). */
  const variables = new Map<string, unknown>();
  for (const [service, s] of Object.entries(schemas))
    for (const [name, field] of Object.entries(
      (s as unknown as { shape: Record<string, z.ZodType> }).shape,
    )) {
      const r = field.safeParse(undefined);
      const value = r.success ? r.data : 'required';
      // One default per name: a table could not document two.
      if (variables.has(name)) expect(variables.get(name), `${service}: ${name}`).toEqual(value);
      variables.set(name, value);
    }
  const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
  const cells = (line: string) =>
    line
      .trim()
      .replace(/^\||\|$/g, '')
      .split('|')
      .map((c) => c.trim());

  /**
   * The rows of every table of `text` headed `variable | default`: the variables a row names (`FLOWS_CHAT_URL` /
   * `_MODEL` is FLOWS_CHAT_MODEL) and the default each is given (one default for all, or one each).
   */
  function rows(text: string): { names: string[]; defaults: string[] | undefined; cell: string }[] {
    const out: { names: string[]; defaults: string[] | undefined; cell: string }[] = [];
    const lines = text.split('\n');
    for (let i = 0; i < lines.length; i++) {
      const head = cells(lines[i]!);
      if (!lines[i]!.startsWith('|') || lines[i - 1]?.startsWith('|')) continue;
      if (head[0]?.toLowerCase() !== 'variable' || head[1]?.toLowerCase() !== 'default') continue;
      for (let j = i + 2; lines[j]?.startsWith('|'); j++) {
        const [first = '', cell = ''] = cells(lines[j]!);
        const names: string[] = [];
        for (const [, token] of first.matchAll(/`(_?[A-Z][A-Z0-9_]*)`/g)) {
          const lead = names[0] ?? '';
          const cut = [...lead.matchAll(/_/g)].map((m) => m.index).reverse();
          const whole = token!.startsWith('_')
            ? (cut.map((k) => lead.slice(0, k) + token).find((n) => variables.has(n)) ?? token!)
            : token!;
          names.push(whole);
        }
        const parts = names.length > 1 ? cell.split(/\s+\/\s+|,\s+/) : [cell];
        const defaults =
          parts.length === names.length ? parts : parts.length === 1 ? names.map(() => cell) : undefined;
        out.push({ names, defaults, cell });
      }
    }
    return out;
  }
  /** Whether a documented default (`3`, 2592000000 (30 days), — (required)) says what the schema does. */
  function agrees(doc: string, value: unknown): boolean {
    if (value === 'required') return /^— \(required\)$/.test(doc);
    const literal = doc.replace(/\s*\(.*\)$/, '').replace(/`/g, '');
    if (value === undefined)
      // Unset: none, or a default derived elsewhere (the broker's, another variable's), never a value of its own.
      return literal === '—' || !/^[\w.-]+$/.test(literal);
    return literal === String(value);
  }
  const main = read('README.md');
  const configuration = main.slice(
    main.indexOf('\n## Configuration\n'),
    main.indexOf('\n## Topics and contracts'),
  );
  const documents = {
    'README.md': configuration,
    ...Object.fromEntries(
      Object.keys(schemas).map((s) => [`services/${s}/README.md`, read(`services/${s}/README.md`)]),
    ),
  };

  it('the README names every variable a service reads, in its table', () => {
    const named = new Set(rows(configuration).flatMap((r) => r.names));
    expect(named.size).toBeGreaterThan(50);
    expect([...variables.keys()].filter((v) => !named.has(v))).toEqual([]);
  });

  it('name only variables a service reads, each with the default it has', () => {
    const wrong: string[] = [];
    let checked = 0;
    for (const [path, text] of Object.entries(documents))
      for (const r of rows(text)) {
        for (const name of r.names)
          if (!variables.has(name)) wrong.push(`${path}: ${name} is read by no service`);
        // HTTP_HOST, HTTP_PORT: the host, then each service's port (below).
        if (r.names.includes('HTTP_PORT')) continue;
        expect(r.defaults, `${path}: ${r.names.join(', ')}: ${r.cell}`).toBeDefined();
        r.names.forEach((name, i) => {
          checked++;
          const doc = r.defaults![i]!;
          if (variables.has(name) && !agrees(doc, variables.get(name)))
            wrong.push(`${path}: ${name} documented as ${doc}, is ${String(variables.get(name))}`);
        });
      }
    expect(checked).toBeGreaterThan(100);
    expect(wrong).toEqual([]);
    // The check is real: a wrong value, a value for a variable without one, and a required one left optional.
    expect(agrees('`4`', 3)).toBe(false);
    expect(agrees('`true`', undefined)).toBe(false);
    expect(agrees('—', 'required')).toBe(false);
    expect(agrees('`2592000000` (30 days)', 2592000000)).toBe(true);
  });

  it("the README's HTTP_PORT defaults are the services' ports", () => {
    const row = rows(configuration).find((r) => r.names.includes('HTTP_PORT'));
    expect(row?.cell).toMatch(/^`0\.0\.0\.0`/);
    expect(variables.get('HTTP_HOST')).toBe('0.0.0.0');
    const ports = Object.fromEntries(
      [...row!.cell.matchAll(/(\w+) (\d+)/g)].map((m) => [m[1], Number(m[2])]),
    );
    expect(ports).toEqual(Object.fromEntries(Object.entries(SERVICES).map(([n, s]) => [n, s.port])));
  });
});

describe('FLOWS_POLICY_FILE', () => {
  it('the READMEs list every per-agent override the file takes', () => {
    const fields = Object.keys(policyFileV1.shape.agents.element.shape).sort();
    for (const path of ['README.md', 'services/flows/README.md']) {
      const text = readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
      const span = /`FLOWS_POLICY_FILE` \(`([^`]*)`\)/.exec(text)?.[1];
      const listed = /\{\s*([a-z_,\s]+?)\s*\}/.exec(span ?? '')?.[1];
      expect(listed, path).toBeDefined();
      expect(listed!.split(/,\s*/).sort(), path).toEqual(fields);
    }
  });
});
