import { isUtf8 } from 'node:buffer';
import { SchemaRegistry, SchemaType } from '@kafkajs/confluent-schema-registry';
import { z } from 'zod';
import { CONTRACTS } from '../schemas/index.js';
import { PaverError, errorMessage } from './errors.js';
import type { DeadLetterReason } from '../schemas/index.js';

/** A message that cannot be turned into a JSON value; `reason` is its dead-letter reason. */
export class DecodeError extends Error {
  constructor(
    readonly reason: DeadLetterReason,
    message: string,
  ) {
    super(message);
    this.name = 'DecodeError';
  }
}

export interface Codec {
  readonly kind: 'json' | 'registry';
  encode(contract: string, topic: string, value: unknown): Promise<Buffer>;
  /** Detects the framing per message: Confluent wire format starts with magic byte 0, JSON text never does. */
  decode(buf: Buffer): Promise<unknown>;
  /**
   * The hot path: decodes without a promise when no I/O is needed (JSON text), throwing DecodeError for bad
   * bytes; returns `undefined` when only `decode` can answer (Confluent framing needs the registry). A codec
   * without it is always decoded through `decode`.
   */
  decodeSync?(buf: Buffer): { value: unknown } | undefined;
  /** Encodes without a promise when no I/O is needed (JSON); absent when every encode may need the registry. */
  encodeSync?(value: unknown): Buffer;
  /**
   * The producer's hot path for a text format (JSON): the record's value as a string, which kafkajs writes
   * straight into its request buffer as UTF-8, so no Buffer is made and copied per record.
   */
  encodeText?(value: unknown): string;
  /**
   * Resolves once the schema registry answers (a registry codec only): how a service finds the registry back
   * after an outage, while its consumption waits and makes no registry call of its own.
   */
  probe?(): Promise<void>;
}

function decodeJson(buf: Buffer): unknown {
  const text = buf.toString('utf8');
  // JSON text is UTF-8 (RFC 8259). Other bytes decode to U+FFFD, and the record would pass with its ids and
  // names silently changed (two different bad names becoming one). Checked only when a U+FFFD shows up.
  if (text.includes('\uFFFD') && !isUtf8(buf)) throw new DecodeError('undecodable', 'not valid UTF-8');
  try {
    return JSON.parse(text);
  } catch {
    throw new DecodeError('undecodable', 'not valid JSON');
  }
}

/** Confluent wire format's header before the JSON text: magic byte 0 and the schema id (4 bytes). */
export const WIRE_HEADER_BYTES = 5;

const isWireFormat = (buf: Buffer): boolean => buf.length >= WIRE_HEADER_BYTES && buf[0] === 0;

function decodeJsonOnly(buf: Buffer): unknown {
  if (isWireFormat(buf)) {
    throw new DecodeError(
      'registry_error',
      'Confluent wire format received but SCHEMA_REGISTRY_URL is not set',
    );
  }
  return decodeJson(buf);
}
const encodeJson = (value: unknown): Buffer => Buffer.from(JSON.stringify(value));

export function jsonCodec(): Codec {
  return {
    kind: 'json',
    async encode(_contract, _topic, value) {
      return encodeJson(value);
    },
    async decode(buf) {
      return decodeJsonOnly(buf);
    },
    decodeSync: (buf) => ({ value: decodeJsonOnly(buf) }),
    encodeSync: encodeJson,
    encodeText: (value) => JSON.stringify(value),
  };
}

const PROBE_TIMEOUT_MS = 5_000;

/**
 * Whether a registry call failed because the registry did not answer, which waiting cures. The client reports
 * every failed HTTP exchange as a ResponseError: refused or reset (as status 400), a 5xx, refused
 * credentials. A 404 (an unknown id or subject), 409 (an incompatible schema) or 422 (an invalid one) is the
 * registry's answer, the same at every try; anything else (a payload its schema refuses, a schema the client
 * cannot compile) never reached it.
 */
function registryDown(err: unknown): boolean {
  const e = err as { name?: unknown; status?: unknown } | null;
  return e?.name === 'ResponseError' && !(e.status === 404 || e.status === 409 || e.status === 422);
}

export interface RegistryOptions {
  url: string;
  username?: string | undefined;
  password?: string | undefined;
}

/**
 * Confluent wire format through @kafkajs/confluent-schema-registry, with JSON Schema subjects
 * `<topic>-value` registered from the zod contracts on first use (ids cached per subject).
 */
export function registryCodec(opts: RegistryOptions): Codec {
  const registry = new SchemaRegistry({
    host: opts.url,
    ...(opts.username ? { auth: { username: opts.username, password: opts.password ?? '' } } : {}),
    retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 1000 },
  } as ConstructorParameters<typeof SchemaRegistry>[0]);
  const ids = new Map<string, Promise<number>>();
  const basic = Buffer.from(`${opts.username ?? ''}:${opts.password ?? ''}`).toString('base64');

  const idFor = (contract: string, topic: string): Promise<number> => {
    const subject = `${topic}-value`;
    let p = ids.get(subject);
    if (!p) {
      const c = CONTRACTS[contract];
      if (!c) throw new PaverError('INTERNAL', `unknown contract ${contract}`);
      const schema = z.toJSONSchema(c.schema, { io: c.io, target: 'draft-7', unrepresentable: 'any' });
      p = registry
        .register({ type: SchemaType.JSON, schema: JSON.stringify(schema) }, { subject })
        .then((r) => r.id);
      // A failed registration must not poison the cache: the next send retries it.
      p.catch(() => ids.delete(subject));
      ids.set(subject, p);
    }
    return p;
  };

  return {
    kind: 'registry',
    async encode(contract, topic, value) {
      try {
        return await registry.encode(await idFor(contract, topic), value);
      } catch (err) {
        // An output its own schema refuses, a subject set to another compatibility level or holding an
        // incompatible schema: the same at every try, so a fault to fix, not an outage to wait out.
        if (!registryDown(err)) {
          throw new PaverError('INTERNAL', `schema registry encode failed: ${errorMessage(err)}`, {
            cause: err,
          });
        }
        throw new PaverError('REGISTRY_UNAVAILABLE', `schema registry encode failed: ${errorMessage(err)}`, {
          cause: err,
        });
      }
    },
    // Plain JSON text needs no registry: only framed messages take the asynchronous (retried) path.
    decodeSync: (buf) => (isWireFormat(buf) ? undefined : { value: decodeJson(buf) }),
    async decode(buf) {
      if (!isWireFormat(buf)) return decodeJson(buf);
      try {
        return await registry.decode(buf);
      } catch (err) {
        // An unknown id (404), a payload that fails or does not parse as its writer's schema, a schema this
        // client cannot compile (an Avro record cut short, a JSON Schema draft it does not know) answer the
        // same on every read: retried, they would hold the partition for good.
        if (!registryDown(err)) {
          throw new DecodeError(
            'registry_error',
            `registry decode failed: ${(err as { name?: string } | null)?.name ?? 'error'}`,
          );
        }
        throw new PaverError('REGISTRY_UNAVAILABLE', `schema registry unavailable: ${errorMessage(err)}`, {
          cause: err,
        });
      }
    },
    async probe() {
      // The global compatibility level: the smallest answer every Confluent-compatible registry gives, and one
      // that needs no subject. Not through the client: its retries would only delay the next probe.
      // fetch() refuses a URL with credentials in it, which the client takes (as basic auth): they are sent as
      // the client sends them, or the probe failed for good and the service stayed paused after one outage.
      const u = new URL(opts.url);
      const inUrl = u.username
        ? Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString(
            'base64',
          )
        : null;
      u.username = '';
      u.password = '';
      const auth = opts.username ? basic : inUrl;
      const res = await fetch(`${u.href.replace(/\/+$/, '')}/config`, {
        headers: auth ? { authorization: `Basic ${auth}` } : {},
        signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
      });
      await res.body?.cancel();
      if (!res.ok && res.status !== 404) throw new Error(`schema registry answered ${res.status}`);
    },
  };
}

export function createCodec(env: {
  SCHEMA_REGISTRY_URL?: string | undefined;
  SCHEMA_REGISTRY_USERNAME?: string | undefined;
  SCHEMA_REGISTRY_PASSWORD?: string | undefined;
}): Codec {
  return env.SCHEMA_REGISTRY_URL
    ? registryCodec({
        url: env.SCHEMA_REGISTRY_URL,
        username: env.SCHEMA_REGISTRY_USERNAME,
        password: env.SCHEMA_REGISTRY_PASSWORD,
      })
    : jsonCodec();
}
