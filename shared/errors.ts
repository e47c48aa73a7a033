/**
 * The closed list of Paver error codes. `retriable` decides whether the consumer runner retries a batch
 * (with backoff) or treats the failure as fatal. Unknown errors are NOT retriable: kafkajs's opposite
 * default turns one bad message into a restart loop.
 */
export const ERROR_CODES = {
  CONFIG_INVALID: { retriable: false },
  REDIS_UNAVAILABLE: { retriable: true },
  REDIS_SCRIPT_FAILED: { retriable: false },
  REDIS_STATE_CONFLICT: { retriable: false },
  STATE_CONTENDED: { retriable: true },
  KAFKA_UNAVAILABLE: { retriable: true },
  DEAD_LETTER_WRITE_FAILED: { retriable: true },
  REGISTRY_UNAVAILABLE: { retriable: true },
  INPUT_INVALID: { retriable: false },
  SHUTTING_DOWN: { retriable: false },
  INTERNAL: { retriable: false },
} as const satisfies Record<string, { retriable: boolean }>;

export type ErrorCode = keyof typeof ERROR_CODES;

export class PaverError extends Error {
  readonly code: ErrorCode;
  readonly retriable: boolean;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'PaverError';
    this.code = code;
    this.retriable = ERROR_CODES[code].retriable;
  }
}

/**
 * Server replies that say "not now" rather than "never": a replica loading, a script running long, a cluster
 * or failover in progress (a demoted primary answers READONLY until clients find the new one), memory full.
 * Retrying later can succeed; every other error reply (a script error, a wrong type) is a bug no retry fixes.
 */
export const TRANSIENT_REPLY = /^(LOADING|BUSY|TRYAGAIN|CLUSTERDOWN|MASTERDOWN|READONLY|OOM|NOREPLICAS)\b/;

/**
 * ioredis's commandTimeout (REDIS_COMMAND_TIMEOUT_MS) failure: its message alone, or as the end of one that names
 * the call (`apply: Command timed out`); a text that merely mentions a timeout is not one.
 */
export const redisCommandTimedOut = (message: string): boolean => /(^|: )Command timed out$/.test(message);

/** Maps third-party failures onto the closed list, by shape rather than `instanceof` (the client may change). */
export function classifyError(err: unknown): PaverError {
  if (err instanceof PaverError) return err;
  const e = err as { name?: string; message?: string; retriable?: boolean; code?: string } | undefined;
  const name = e?.name ?? '';
  const message = e?.message ?? String(err);
  if (/^KafkaJS/.test(name)) {
    // kafkajs marks its own retriable errors; trust that flag but never its default for unknown errors.
    return new PaverError(e?.retriable === true ? 'KAFKA_UNAVAILABLE' : 'INTERNAL', `${name}: ${message}`, {
      cause: err,
    });
  }
  if (
    e?.code === 'ECONNREFUSED' ||
    e?.code === 'ECONNRESET' ||
    e?.code === 'ETIMEDOUT' ||
    e?.code === 'EPIPE' ||
    name === 'MaxRetriesPerRequestError' ||
    // ioredis's commandTimeout (REDIS_COMMAND_TIMEOUT_MS): Redis did not answer in time, a hang rather than a
    // refusal: taken for INTERNAL, one frozen Redis would stop the service instead of retrying its batch.
    redisCommandTimedOut(message) ||
    /Connection is closed|Stream isn't writeable|LOADING|BUSY|TRYAGAIN|CLUSTERDOWN/.test(message) ||
    // The same transient replies redisFailure knows: a reply classified here (the detector's pipelines, any raw
    // ioredis error) must not take READONLY, MASTERDOWN, OOM or NOREPLICAS for a bug and stop the service.
    TRANSIENT_REPLY.test(message)
  ) {
    return new PaverError('REDIS_UNAVAILABLE', message, { cause: err });
  }
  return new PaverError('INTERNAL', message, { cause: err });
}

/**
 * The broker's answer, anywhere in `err`'s cause chain, that it will never take this write as things are
 * configured: a kafkajs protocol error it marks non-retriable (TOPIC_AUTHORIZATION_FAILED,
 * CLUSTER_AUTHORIZATION_FAILED, INVALID_RECORD on a compacted topic, ...). Retrying cannot help; a person must
 * change an ACL or the topic. Null for anything else (an unreachable broker, a timeout, a leader moving).
 */
export function kafkaRefusal(err: unknown): { type: string; message: string } | null {
  let e = err as
    { name?: unknown; type?: unknown; retriable?: unknown; message?: unknown; cause?: unknown } | undefined;
  for (let i = 0; e && i < 6; i++) {
    if (e.name === 'KafkaJSProtocolError' && e.retriable === false && typeof e.type === 'string')
      return { type: e.type, message: typeof e.message === 'string' ? e.message : e.type };
    e = (e.cause ?? (e as { originalError?: unknown }).originalError) as typeof e;
  }
  return null;
}

/**
 * A write to `topic` the broker refused for good (kafkaRefusal), as the configuration error it is: named by its
 * topic and cause, not retried, so the service stops with it and its batch stays uncommitted. Null otherwise.
 */
export function writeRefused(topic: string, err: unknown): PaverError | null {
  const r = kafkaRefusal(err);
  if (!r) return null;
  return new PaverError(
    'CONFIG_INVALID',
    `${topic} refused the write for good: ${r.type} (${r.message}); check this service's permissions (ACLs) on the topic and the cluster, and the topic's configuration. Retrying cannot help`,
    { cause: err },
  );
}

/** The message of anything thrown: `throw` accepts any value, so never assume an `Error`. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  if (typeof err === 'object' && err !== null && typeof (err as { message?: unknown }).message === 'string') {
    return (err as { message: string }).message;
  }
  return String(err);
}
