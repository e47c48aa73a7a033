import { readFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { z } from 'zod';
import { PaverError } from './errors.js';
import { HASH_ONLY_DEAD_LETTER_MAX_BYTES } from './kafka/dead-letter.js';

/** Environment booleans: true/false/1/0/yes/no/on/off, case-insensitive. */
export const envBool = z.stringbool({
  truthy: ['true', '1', 'yes', 'on'],
  falsy: ['false', '0', 'no', 'off'],
  case: 'insensitive',
});
/**
 * One seed broker as kafkajs takes it: it splits the address at ':' and keeps the first two parts, so a listener
 * copied from the broker's configuration (PLAINTEXT://kafka:9092) or an IPv6 literal ([::1]:9092) became host
 * `PLAINTEXT` or `[`, and the start failed minutes later on a name lookup that did not name the variable.
 */
const brokerAddress = z.string().superRefine((s, ctx) => {
  const m = /^([^\s,:/[\]]+):(\d{1,5})$/.exec(s);
  const port = Number(m?.[2]);
  if (m && port >= 1 && port <= 65535) return;
  ctx.addIssue({
    code: 'custom',
    message: s.includes('://')
      ? 'expected host:port without a scheme (not PLAINTEXT:// or SASL_SSL://: KAFKA_SSL and KAFKA_SASL_MECHANISM say that)'
      : m
        ? 'expected host:port with a port from 1 to 65535'
        : 'expected host:port (a host name or IPv4 address: kafkajs cannot take an IPv6 literal)',
  });
});
const csv = z
  .string()
  .transform((s) =>
    s
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean),
  )
  .pipe(z.array(brokerAddress).min(1, 'expected at least one host:port'));
/**
 * An integer variable. Every failure says the accepted range: zod's own messages said "expected number, received
 * NaN" for `5s` and "expected int, received number" for `1.5`, leaving the operator to find the range in the code.
 */
export const int = (min: number, max = Number.MAX_SAFE_INTEGER) => {
  const error =
    max === Number.MAX_SAFE_INTEGER
      ? `expected an integer ≥ ${min}`
      : `expected an integer from ${min} to ${max}`;
  return z.coerce.number({ error }).int({ error }).min(min, { error }).max(max, { error });
};
/** Kafka's rule for a topic name: its legal characters, at most 249 of them, and neither `.` nor `..`. */
export const MAX_TOPIC_NAME = 249;
/**
 * A decimal variable whose every failure says the accepted range (zod's own: "expected number, received NaN").
 * `gt`/`lt` are exclusive bounds, `min`/`max` inclusive.
 */
export function decimal(b: { min?: number; max?: number; gt?: number; lt?: number } = {}) {
  const low = b.gt !== undefined ? `> ${b.gt}` : b.min !== undefined ? `≥ ${b.min}` : '';
  const high = b.lt !== undefined ? `< ${b.lt}` : b.max !== undefined ? `≤ ${b.max}` : '';
  const error = `expected a number${[low, high]
    .filter(Boolean)
    .map((x) => ` ${x}`)
    .join(' and')}`;
  let n = z.coerce.number({ error });
  if (b.min !== undefined) n = n.min(b.min, { error });
  if (b.gt !== undefined) n = n.gt(b.gt, { error });
  if (b.max !== undefined) n = n.max(b.max, { error });
  if (b.lt !== undefined) n = n.lt(b.lt, { error });
  return n;
}
/** An http(s) URL variable; zod's own message was "Invalid URL", whatever was wrong. */
export const httpUrl = z.url({ protocol: /^https?$/, error: 'expected an http:// or https:// URL' });
export const topicName = z
  .string()
  .regex(
    /^(?!\.{1,2}$)[a-zA-Z0-9._-]{1,249}$/,
    'expected a Kafka topic name (1 to 249 of [a-zA-Z0-9._-], not . or ..)',
  );

/**
 * The address the HTTP server binds: an IP address (IPv6 without brackets, as Node takes it) or a host name. A
 * `host:port`, a URL or a bracketed IPv6 literal passed and the start failed on a name lookup (exit 1, no
 * variable named); whether a well-formed name resolves is still learnt at bind time.
 */
const httpHost = z.string().refine(
  (s) =>
    isIP(s) !== 0 ||
    (s.length <= 253 &&
      // All digits and dots is an IPv4 address or nothing (999.1.1.1 is not a name).
      !/^[\d.]+$/.test(s) &&
      /^(?!-)[a-zA-Z0-9_-]{1,63}(?<!-)(\.(?!-)[a-zA-Z0-9_-]{1,63}(?<!-))*\.?$/.test(s)),
  {
    error: (issue) =>
      String(issue.input).startsWith('[')
        ? 'expected an IPv6 address without brackets (:: or ::1)'
        : 'expected a host name or IP address to bind (0.0.0.0, ::, 127.0.0.1, localhost), no port or scheme: the port is HTTP_PORT',
  },
);

/**
 * Largest configuration file (orchestration, catalog, flows, policy, candidates) read whole, from a path or
 * stdin: a file is parsed in memory, so without a bound a huge one (or an endless stdin) exhausts it. Below V8's
 * largest string (about 512 MiB), which the text must fit anyway.
 */
export const DEFAULT_MAX_CONFIG_BYTES = 64 * 1024 * 1024;
/** Largest whole-file input any limit may allow: under V8's largest string, which the text must fit. */
export const MAX_WHOLE_INPUT_BYTES = 500 * 1024 * 1024;
export const maxConfigBytes = int(1024, MAX_WHOLE_INPUT_BYTES).default(DEFAULT_MAX_CONFIG_BYTES);

/**
 * PAVER_MAX_OUTPUT_BYTES. Its least is the largest dead letter without its original bytes (about 25 KiB, a detail of
 * 4,096 characters at its longest as JSON): that one goes whatever the limit, and under a smaller limit (down to
 * 1,024 before) the hash-only record of a long detail or topic name was still over it, and left for the broker to
 * refuse as too large, which stops the service.
 */
const MAX_OUTPUT_BYTES_MAX = 50 * 1024 * 1024;
const maxOutputBytesError = `expected an integer from ${HASH_ONLY_DEAD_LETTER_MAX_BYTES} to ${MAX_OUTPUT_BYTES_MAX} (the least holds the largest dead letter without its original bytes, ${HASH_ONLY_DEAD_LETTER_MAX_BYTES} bytes as the broker counts it)`;
const maxOutputBytes = z.coerce
  .number({ error: maxOutputBytesError })
  .int({ error: maxOutputBytesError })
  .min(HASH_ONLY_DEAD_LETTER_MAX_BYTES, { error: maxOutputBytesError })
  .max(MAX_OUTPUT_BYTES_MAX, { error: maxOutputBytesError });

/** Variables every service and the CLI share. Service configs extend this object. */
export const commonEnvShape = {
  KAFKA_BROKERS: csv,
  KAFKA_CLIENT_ID: z.string().min(1).default('paver'),
  KAFKA_SSL: envBool.default(false),
  KAFKA_SSL_CA_FILE: z.string().min(1).optional(),
  KAFKA_SSL_CERT_FILE: z.string().min(1).optional(),
  KAFKA_SSL_KEY_FILE: z.string().min(1).optional(),
  KAFKA_SSL_REJECT_UNAUTHORIZED: envBool.default(true),
  // Kafka's own configuration spells them PLAIN and SCRAM-SHA-512 (sasl.mechanism); kafkajs takes lower case.
  KAFKA_SASL_MECHANISM: z
    .string()
    .transform((s) => s.toLowerCase())
    .pipe(z.enum(['plain', 'scram-sha-256', 'scram-sha-512']))
    .optional(),
  KAFKA_SASL_USERNAME: z.string().min(1).optional(),
  KAFKA_SASL_PASSWORD: z.string().min(1).optional(),
  KAFKA_TOPIC_PARTITIONS: int(1, 10_000).default(3),
  // Unset: the broker's default.replication.factor (kafkajs sends -1, KIP-464). A default of 1 here overrode it,
  // so every topic Paver created in a production cluster had one replica unless this was set.
  KAFKA_REPLICATION_FACTOR: int(1, 10).optional(),
  KAFKA_CREATE_TOPICS: envBool.default(true),
  KAFKA_SESSION_TIMEOUT_MS: int(6_000, 300_000).default(30_000),
  KAFKA_MAX_WAIT_MS: int(10, 10_000).default(200),
  KAFKA_MAX_BYTES_PER_PARTITION: int(1024, 100 * 1024 * 1024).default(1024 * 1024),
  KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY: int(1, 64).default(3),
  PAVER_TOPIC_TOOL_CALLS: topicName.default('paver.tool-calls.v1'),
  PAVER_TOPIC_FLOW_CANDIDATES: topicName.default('paver.flow-candidates.v1'),
  PAVER_TOPIC_NEXT_ACTIONS: topicName.default('paver.next-actions.v1'),
  PAVER_TOPIC_SEQUENCE_STATE: topicName.default('paver.sequence-state.v1'),
  PAVER_TOPIC_FLOW_SELECTIONS: topicName.default('paver.flow-selections.v1'),
  PAVER_TOPIC_DEAD_LETTERS: topicName.default('paver.dead-letters.v1'),
  PAVER_MAX_MESSAGE_BYTES: int(1024, 50 * 1024 * 1024).default(1024 * 1024),
  /**
   * Largest output record produced, counted as the broker counts it against max.message.bytes (batch framing, key,
   * value, headers): at or under the topics' limit (1 MiB by default). A bigger one is made smaller where its
   * contract allows, else left out and counted; a bigger dead letter goes without its original bytes.
   */
  PAVER_MAX_OUTPUT_BYTES: maxOutputBytes.default(1_000_000),
  /** Dead letters keep the original bytes up to this size, beyond it a hash: a record always fits the broker. */
  PAVER_DEAD_LETTER_MAX_ORIGINAL_BYTES: int(0, 10 * 1024 * 1024).default(256 * 1024),
  /** How often each consumer asks the broker for its group's state and lag (readiness, lag, oldest age). */
  PAVER_LAG_POLL_MS: int(100, 300_000).default(5_000),
  /**
   * Records per handler call, each followed by its commit. The default takes a whole fetched batch (bounded by
   * KAFKA_MAX_BYTES_PER_PARTITION) as one chunk: one state load, one produce, one commit per batch.
   */
  PAVER_BATCH_CHUNK: int(1, 100_000).default(10_000),
  PAVER_RETRY_ATTEMPTS: int(0, 100).default(8),
  PAVER_RETRY_INITIAL_MS: int(1, 60_000).default(100),
  PAVER_RETRY_MAX_MS: int(1, 600_000).default(5_000),
  PAVER_MAX_CONSUMER_RESTARTS: int(0, 1000).default(10),
  PAVER_SHUTDOWN_TIMEOUT_MS: int(100, 600_000).default(25_000),
  /**
   * The process that started this service (`paver dev` sets it): once that pid is gone, the service stops
   * gracefully, as on SIGTERM, instead of running on as an orphan.
   */
  PAVER_PARENT_PID: int(2).optional(),
  PAVER_MAX_CONFIG_BYTES: maxConfigBytes,
  REDIS_URL: z.url({ protocol: /^rediss?$/, error: 'expected redis://host:port[/db] or rediss://…' }),
  REDIS_PASSWORD: z.string().min(1).optional(),
  REDIS_USERNAME: z.string().min(1).optional(),
  REDIS_TLS_CA_FILE: z.string().min(1).optional(),
  REDIS_TLS_REJECT_UNAUTHORIZED: envBool.default(true),
  /**
   * How long a Redis command may wait for its reply. A Redis that stops answering without closing the connection
   * (a frozen process, a partition that drops packets) otherwise holds a batch until TCP gives up, minutes later;
   * past this the command fails as a transient error and the batch is retried. Must exceed the slowest script
   * call (one chunk's), or that chunk is retried for ever.
   */
  REDIS_COMMAND_TIMEOUT_MS: int(100, 600_000).default(5_000),
  REDIS_KEY_PREFIX: z
    .string()
    // No braces: a hash tag in the prefix would put every key in one Redis Cluster slot.
    .regex(/^[a-zA-Z0-9_.:-]{1,64}$/, 'expected 1 to 64 of [a-zA-Z0-9_.:-] (no braces, no spaces)')
    .default('paver'),
  SCHEMA_REGISTRY_URL: httpUrl.optional(),
  SCHEMA_REGISTRY_USERNAME: z.string().min(1).optional(),
  SCHEMA_REGISTRY_PASSWORD: z.string().min(1).optional(),
  HTTP_HOST: httpHost.default('0.0.0.0'),
  HTTP_PORT: int(0, 65535).optional(),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
} as const;

export const commonEnvSchema = z.object(commonEnvShape);
export type CommonEnv = z.infer<typeof commonEnvSchema>;

/**
 * The variables of one parse as a cross-variable rule may read them: only those that passed their own check.
 * zod runs an object's refinements only when every field parsed, so `DETECTOR_LOOKBACK=abc` hid
 * `PAVER_RETRY_INITIAL_MS > PAVER_RETRY_MAX_MS` until it was fixed, and the user needed a second round; a rule
 * whose inputs all parsed runs here whatever else failed, and a rule over one that did not is skipped (its value
 * is not known, and the variable's own error is already listed).
 */
export class ParsedEnv<T> {
  constructor(
    private readonly env: T,
    private readonly failed: ReadonlySet<PropertyKey>,
  ) {}

  /** `rule` over the variables named (an unset optional one is undefined), or undefined if one failed its parse. */
  with<K extends keyof T, R>(inputs: readonly K[], rule: (env: Pick<T, K>) => R): R | undefined {
    return inputs.some((k) => this.failed.has(k)) ? undefined : rule(this.env);
  }

  /** A variable's value, or undefined when it is unset or failed its parse. */
  get<K extends keyof T>(key: K): T[K] | undefined {
    return this.with([key], (e) => e[key]);
  }
}

/**
 * An environment schema with its cross-variable rules, run even when other variables failed their own parse (see
 * ParsedEnv). Issues add up in one error, as zod's superRefine keeps them.
 */
export function crossChecked<S extends z.ZodObject>(
  schema: S,
  rules: (env: ParsedEnv<z.output<S>>, ctx: z.RefinementCtx) => void,
): S {
  return schema.superRefine(
    (value, ctx) => {
      const failed = new Set<PropertyKey>(ctx.issues.map((i) => i.path?.[0] ?? ''));
      rules(new ParsedEnv(value, failed), ctx);
    },
    // Not when the input was not an object at all (no variable is known) or an issue names none.
    {
      when: (payload) =>
        typeof payload.value === 'object' &&
        payload.value !== null &&
        payload.issues.every((i) => (i.path?.length ?? 0) > 0),
    },
  );
}

/**
 * Cross-field rules shared by every service schema. `topics`: the service's own topic variables besides the
 * common ones (undefined when unset or unparsed), each of which must name a topic of its own. Two roles on one
 * topic is a copied line, never a design: dead letters written to the input were read back and dead-lettered
 * again for ever, and a state copy shared with an output topic was restored from records of another contract.
 */
export function refineCommon(
  env: ParsedEnv<CommonEnv>,
  ctx: z.RefinementCtx,
  topics: Readonly<Record<string, string | undefined>> = {},
): void {
  const seen = new Map<string, string>();
  for (const [key, topic] of Object.entries({
    PAVER_TOPIC_TOOL_CALLS: env.get('PAVER_TOPIC_TOOL_CALLS'),
    PAVER_TOPIC_FLOW_CANDIDATES: env.get('PAVER_TOPIC_FLOW_CANDIDATES'),
    PAVER_TOPIC_NEXT_ACTIONS: env.get('PAVER_TOPIC_NEXT_ACTIONS'),
    PAVER_TOPIC_SEQUENCE_STATE: env.get('PAVER_TOPIC_SEQUENCE_STATE'),
    PAVER_TOPIC_FLOW_SELECTIONS: env.get('PAVER_TOPIC_FLOW_SELECTIONS'),
    PAVER_TOPIC_DEAD_LETTERS: env.get('PAVER_TOPIC_DEAD_LETTERS'),
    ...topics,
  })) {
    if (topic === undefined) continue;
    const first = seen.get(topic);
    if (first)
      ctx.addIssue({
        code: 'custom',
        path: [key],
        message: `names the same topic as ${first} (${topic}): each needs a topic of its own`,
      });
    else seen.set(topic, key);
  }
  env.with(['KAFKA_SASL_MECHANISM', 'KAFKA_SASL_USERNAME', 'KAFKA_SASL_PASSWORD'], (e) => {
    if (e.KAFKA_SASL_MECHANISM && (!e.KAFKA_SASL_USERNAME || !e.KAFKA_SASL_PASSWORD)) {
      ctx.addIssue({
        code: 'custom',
        path: ['KAFKA_SASL_USERNAME'],
        message: 'KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are required when KAFKA_SASL_MECHANISM is set',
      });
    }
    // Credentials the client would drop without a word: it would connect unauthenticated instead of failing.
    if (!e.KAFKA_SASL_MECHANISM && (e.KAFKA_SASL_USERNAME || e.KAFKA_SASL_PASSWORD)) {
      ctx.addIssue({
        code: 'custom',
        path: ['KAFKA_SASL_MECHANISM'],
        message:
          'required with KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD (plain, scram-sha-256 or scram-sha-512)',
      });
    }
  });
  env.with(['REDIS_URL', 'REDIS_USERNAME', 'REDIS_PASSWORD'], (e) => redisUrlIssues(e, ctx));
  // The backoff caps each wait at the maximum: a first wait above it was cut to it without a word.
  env.with(['PAVER_RETRY_INITIAL_MS', 'PAVER_RETRY_MAX_MS'], (e) => {
    if (e.PAVER_RETRY_INITIAL_MS > e.PAVER_RETRY_MAX_MS)
      ctx.addIssue({
        code: 'custom',
        path: ['PAVER_RETRY_INITIAL_MS'],
        message: `must be ≤ PAVER_RETRY_MAX_MS (${e.PAVER_RETRY_MAX_MS}), the cap on every wait`,
      });
  });
  // Turning the certificate check off says TLS is meant; without any TLS setting it was dropped without a word,
  // and the client spoke plaintext to a TLS listener: timeouts at start-up (Kafka) or never ready (Redis).
  env.with(
    ['KAFKA_SSL', 'KAFKA_SSL_REJECT_UNAUTHORIZED', 'KAFKA_SSL_CA_FILE', 'KAFKA_SSL_CERT_FILE'],
    (e) => {
      if (!e.KAFKA_SSL_REJECT_UNAUTHORIZED && !e.KAFKA_SSL && !e.KAFKA_SSL_CA_FILE && !e.KAFKA_SSL_CERT_FILE)
        ctx.addIssue({
          code: 'custom',
          path: ['KAFKA_SSL'],
          message:
            'must be true with KAFKA_SSL_REJECT_UNAUTHORIZED=false (a TLS setting: without TLS it does nothing)',
        });
    },
  );
  env.with(['REDIS_URL', 'REDIS_TLS_REJECT_UNAUTHORIZED', 'REDIS_TLS_CA_FILE'], (e) => {
    if (!e.REDIS_TLS_REJECT_UNAUTHORIZED && !e.REDIS_TLS_CA_FILE && !/^rediss:/i.test(e.REDIS_URL))
      ctx.addIssue({
        code: 'custom',
        path: ['REDIS_URL'],
        message:
          'must be rediss://… with REDIS_TLS_REJECT_UNAUTHORIZED=false (a TLS setting: without TLS it does nothing)',
      });
  });
  env.with(['KAFKA_SSL_CERT_FILE', 'KAFKA_SSL_KEY_FILE'], (e) => {
    if (!!e.KAFKA_SSL_CERT_FILE !== !!e.KAFKA_SSL_KEY_FILE) {
      ctx.addIssue({
        code: 'custom',
        path: ['KAFKA_SSL_KEY_FILE'],
        message: 'KAFKA_SSL_CERT_FILE and KAFKA_SSL_KEY_FILE go together',
      });
    }
  });
  env.with(['SCHEMA_REGISTRY_URL', 'SCHEMA_REGISTRY_USERNAME', 'SCHEMA_REGISTRY_PASSWORD'], (e) => {
    if (e.SCHEMA_REGISTRY_USERNAME && !e.SCHEMA_REGISTRY_PASSWORD) {
      ctx.addIssue({
        code: 'custom',
        path: ['SCHEMA_REGISTRY_PASSWORD'],
        message: 'required with SCHEMA_REGISTRY_USERNAME',
      });
    }
    // Dropped without a word otherwise: a password alone sent no credentials, and credentials without the URL
    // left the services writing plain JSON where the registry's framing was meant.
    if (e.SCHEMA_REGISTRY_PASSWORD && !e.SCHEMA_REGISTRY_USERNAME) {
      ctx.addIssue({
        code: 'custom',
        path: ['SCHEMA_REGISTRY_USERNAME'],
        message: 'required with SCHEMA_REGISTRY_PASSWORD',
      });
    }
    if ((e.SCHEMA_REGISTRY_USERNAME || e.SCHEMA_REGISTRY_PASSWORD) && !e.SCHEMA_REGISTRY_URL) {
      ctx.addIssue({
        code: 'custom',
        path: ['SCHEMA_REGISTRY_URL'],
        message: 'required with SCHEMA_REGISTRY_USERNAME/SCHEMA_REGISTRY_PASSWORD (https://host[:port])',
      });
    }
  });
  for (const key of [
    'KAFKA_SSL_CA_FILE',
    'KAFKA_SSL_CERT_FILE',
    'KAFKA_SSL_KEY_FILE',
    'REDIS_TLS_CA_FILE',
  ] as const) {
    const file = env.get(key);
    if (file) {
      try {
        readFileSync(file);
      } catch {
        ctx.addIssue({ code: 'custom', path: [key], message: `cannot read file ${file}` });
      }
    }
  }
}

/**
 * What the Redis client would choke on or drop in REDIS_URL: a user or password it cannot percent-decode (it
 * throws "URI malformed" at start-up), a user with no password (no AUTH is sent: the default user is used), no
 * host or a path that is not a database number (both taken for defaults without a word).
 * Messages never quote the URL: it may hold the password.
 */
function redisUrlIssues(
  env: Pick<CommonEnv, 'REDIS_URL' | 'REDIS_USERNAME' | 'REDIS_PASSWORD'>,
  ctx: z.RefinementCtx,
): void {
  let user = '';
  let password = '';
  try {
    const url = new URL(env.REDIS_URL);
    // ioredis reads no host as localhost, and the path through parseInt: /paver or /abc selected database 0.
    if (!url.hostname)
      ctx.addIssue({
        code: 'custom',
        path: ['REDIS_URL'],
        message: 'has no host (expected redis://host:port)',
      });
    if (!/^(\/\d{0,9})?$/.test(url.pathname))
      ctx.addIssue({
        code: 'custom',
        path: ['REDIS_URL'],
        message:
          'its path must be a database number (redis://host:port/0); the key prefix is REDIS_KEY_PREFIX',
      });
    user = decodeURIComponent(url.username);
    password = decodeURIComponent(url.password);
  } catch {
    ctx.addIssue({
      code: 'custom',
      path: ['REDIS_URL'],
      message: 'bad percent-encoding in its user or password (write reserved characters as %XX)',
    });
    return;
  }
  if ((env.REDIS_USERNAME || user) && !(env.REDIS_PASSWORD || password)) {
    ctx.addIssue({
      code: 'custom',
      path: ['REDIS_PASSWORD'],
      message: 'required with a Redis user (REDIS_USERNAME or a user in REDIS_URL)',
    });
  }
}

/**
 * Parses the environment with a service's schema. On failure throws one CONFIG_INVALID error listing every
 * bad variable (never their values: a password must not reach a log).
 */
export function parseEnv<S extends z.ZodType>(schema: S, env: NodeJS.ProcessEnv): z.infer<S> {
  // Empty strings mean "unset": shells and compose files often export VAR= for optional settings.
  const cleaned: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined && v !== '') cleaned[k] = v;
  const parsed = schema.safeParse(cleaned);
  if (parsed.success) return Object.freeze(parsed.data) as z.infer<S>;
  const lines = parsed.error.issues.map((i) => {
    const key = i.path.length ? i.path.join('.') : '(environment)';
    const message =
      i.code === 'invalid_type' && cleaned[String(i.path[0])] === undefined ? 'is required' : i.message;
    return `  - ${key}: ${message}`;
  });
  throw new PaverError(
    'CONFIG_INVALID',
    `Invalid configuration (${lines.length} problem(s)):\n${lines.join('\n')}`,
  );
}

/** Edit distance (insertions, deletions, substitutions, swaps of neighbours) of two short names. */
function distance(a: string, b: string): number {
  const d = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++)
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  return d[a.length]![b.length]!;
}

/**
 * Variables of the environment that are not the schema's but one or two keystrokes from one of its own
 * (DETECTOR_MIN_LENGHT, REDIS_KEY_PREFX, LOG_LEVLE): the variable meant keeps its default without a word.
 * Only near misses: the environment holds many variables that are not Paver's (Kubernetes service links,
 * another service's settings from a shared ConfigMap), and those are none of its business.
 */
export function misspeltVariables(
  schema: z.ZodType,
  env: NodeJS.ProcessEnv,
): { variable: string; meant: string }[] {
  const known = Object.keys((schema as { shape?: Record<string, unknown> }).shape ?? {});
  const out: { variable: string; meant: string }[] = [];
  for (const name of Object.keys(env)) {
    if (known.includes(name) || !/^[A-Z][A-Z0-9_]*$/.test(name)) continue;
    const meant = known.find((k) => Math.abs(k.length - name.length) <= 2 && distance(k, name) <= 2);
    if (meant && name.length >= 8) out.push({ variable: name, meant });
  }
  return out;
}

/** Process exit code for configuration errors (sysexits EX_CONFIG). */
export const EXIT_CONFIG = 78;
