import { fileURLToPath } from 'node:url';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { stateLostMidRead, type EpochMarker } from '../../../../../shared/redis/epoch.js';
import { escapeKeyPart } from '../../../../../shared/redis/keys.js';
import { execPipeline, redisFailure } from '../../../../../shared/redis/replies.js';
import {
  defineScripts,
  invokeScript,
  parseScriptReply,
  readScripts,
} from '../../../../../shared/redis/scripts.js';
import { newSession, type SessionState } from '../../core/session.js';
import { StateCache } from '../state-cache.js';

export const SCRIPT_DIR = fileURLToPath(new URL('./lua/', import.meta.url));
/** Every script in SCRIPT_DIR (a test holds the folder to this list). */
export const SCRIPTS = ['restoreSession', 'writeSessionIfUnchanged'] as const;

const writtenReply = z.tuple([z.literal(1)]);
const WRITE_CODES = {
  [-1]: {
    code: 'STATE_CONTENDED',
    message: 'session state changed under this consumer (rebalance); retrying the batch from fresh state',
  },
} as const;

export interface SessionRef {
  tenant: string;
  agent: string;
  session: string;
}

/** One key per session, its own hash tag: sessions spread over a cluster's slots. */
export const sessionKey = (prefix: string, r: SessionRef) =>
  `${prefix}:seq:{${escapeKeyPart(r.tenant)}|${escapeKeyPart(r.agent)}|${escapeKeyPart(r.session)}}`;

// Stored as a positional array: a few hundred bytes per session, not a few kilobytes.
export const storedV1 = z.tuple([
  z.string().nullable(),
  z.number().int().nonnegative(),
  z.union([z.literal(0), z.literal(1)]),
  z.array(z.string()),
  z.array(z.string()),
  z.array(z.string()),
  z.number().int().nullable(),
  z.string().regex(/^\d+$/).nullable(),
]);
const encode = (s: SessionState) =>
  JSON.stringify([
    s.step,
    s.index,
    s.held ? 1 : 0,
    s.history,
    s.msg,
    s.seen,
    s.pos?.p ?? null,
    s.pos?.o ?? null,
  ]);
const isStrings = (x: unknown): x is string[] => Array.isArray(x) && x.every((v) => typeof v === 'string');
const isIntOrNull = (x: unknown): x is number | null => x === null || Number.isSafeInteger(x);
// The redelivery guard compares offsets as BigInt, which throws on anything but digits.
const isOffsetOrNull = (x: unknown): x is string | null =>
  x === null || (typeof x === 'string' && /^\d+$/.test(x));

/** The `storedV1` tuple checked by hand: this runs for every session of every batch. A unit test holds the two equal. */
export function isStoredV1(v: unknown): v is z.infer<typeof storedV1> {
  return (
    Array.isArray(v) &&
    v.length === 8 &&
    (v[0] === null || typeof v[0] === 'string') &&
    Number.isSafeInteger(v[1]) &&
    (v[1] as number) >= 0 &&
    (v[2] === 0 || v[2] === 1) &&
    isStrings(v[3]) &&
    isStrings(v[4]) &&
    isStrings(v[5]) &&
    isIntOrNull(v[6]) &&
    isOffsetOrNull(v[7])
  );
}

/**
 * Anything this version cannot read (another layout, not JSON at all, a value restored from a damaged session
 * topic record) is a fresh session: a throw here would fail the batch on every retry, stopping the consumer.
 */
export function decode(json: string): SessionState {
  let v: unknown;
  try {
    v = JSON.parse(json);
  } catch {
    return newSession();
  }
  if (!isStoredV1(v)) return newSession();
  const [step, index, held, history, msg, seen, p, o] = v;
  return {
    step,
    index,
    held: held === 1,
    history,
    msg,
    seen,
    pos: p !== null && o !== null ? { p, o } : null,
  };
}

/**
 * `<version>|<state>` as the write script reads it: a value without a numeric version is one the script sees as
 * version '', so it is loaded as a new session at '' (any other version would lose every compare-and-set, and the
 * batch would be retried for ever).
 */
function parseStored(raw: string): { state: SessionState; version: string } | null {
  const m = /^(\d+)\|/.exec(raw);
  return m ? { state: decode(raw.slice(m[0].length)), version: m[1]! } : null;
}

export interface Loaded {
  state: SessionState;
  version: string;
  /** The session's Redis key, for `save` (built once per batch, not twice). */
  key: string;
}

/**
 * Session state in Redis: one pipelined read and one pipelined compare-and-set script per batch. The CAS makes
 * a write that raced another instance (a rebalance) fail the batch, which is then retried from fresh state.
 */
export class RedisSessionStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly ttlMs: number,
    /** States this instance wrote, for `read()`; the batch path always reads Redis (its CAS base). */
    readonly cache: StateCache = new StateCache(0, 0),
    /** The epoch marker the guard last saw: read after a batch's sessions, to tell reads that met a loss. */
    private readonly marker: () => EpochMarker | null = () => null,
  ) {
    defineScripts(redis, readScripts(SCRIPT_DIR, [...SCRIPTS]));
  }

  async load(refs: Map<string, SessionRef>): Promise<Map<string, Loaded>> {
    const ids = [...refs.keys()];
    const out = new Map<string, Loaded>();
    if (!ids.length) return out;
    const pipe = this.redis.pipeline();
    const keys = ids.map((id) => sessionKey(this.prefix, refs.get(id)!));
    for (const key of keys) pipe.get(key);
    // Last, after the sessions: a state lost before or while they were read has taken the marker with it.
    const marker = this.marker();
    if (marker?.value) pipe.get(marker.key);
    const values = await execPipeline(pipe, 'session read');
    if (marker?.value && values.at(-1) !== marker.value) throw stateLostMidRead();
    ids.forEach((id, i) => {
      const raw = values[i];
      const key = keys[i]!;
      const stored = typeof raw === 'string' ? parseStored(raw) : null;
      out.set(id, stored ? { ...stored, key } : { state: newSession(), version: '', key });
    });
    return out;
  }

  /** The values Redis holds under these session keys, as they are (null: none), in one pipelined round trip. */
  async stored(keys: string[]): Promise<(string | null)[]> {
    if (!keys.length) return [];
    const pipe = this.redis.pipeline();
    for (const key of keys) pipe.get(key);
    const values = await execPipeline(pipe, 'session read');
    return values.map((v) => (typeof v === 'string' ? v : null));
  }

  /** The state this instance last wrote for the session, if cached: no Redis command. */
  cached(ref: SessionRef): SessionState | undefined {
    return this.cache.get(sessionKey(this.prefix, ref))?.state;
  }

  /**
   * A session's state for a reader (allowed tools): what this instance last wrote, else Redis (one plain `GET`:
   * a pipeline for one key costs a pipeline object and its command wrappers on every read).
   */
  async read(ref: SessionRef): Promise<{ state: SessionState | null; cached: boolean }> {
    const hit = this.cached(ref);
    if (hit) return { state: hit, cached: true };
    return { state: await this.fromRedis(ref), cached: false };
  }

  /**
   * The session's state in Redis, not the cache's (a new session when none); null when the read met a Redis
   * loss: the epoch marker, read right after it on the same connection, is gone or another (a loss between the
   * guard's check, on its own connection, and this read). Two plain GETs, not a pipeline: one connection runs
   * them in order, without a pipeline object per read.
   */
  async fromRedis(ref: SessionRef): Promise<SessionState | null> {
    const marker = this.marker();
    let raw: string | null;
    let seen: string | null = null;
    try {
      [raw, seen] = await Promise.all([
        this.redis.get(sessionKey(this.prefix, ref)),
        marker?.value ? this.redis.get(marker.key) : Promise.resolve(null),
      ]);
    } catch (err) {
      throw redisFailure('session read', err);
    }
    if (marker?.value && seen !== marker.value) return null;
    return (raw === null ? null : parseStored(raw))?.state ?? newSession();
  }

  /**
   * What `save` will write for each session: its key, the version read and the value (`<next version>|<state>`),
   * the same bytes the session topic copies. `key`: the one `load` gave (else built from `ref`).
   */
  plan(writes: SessionWrite[]): PlannedWrite[] {
    return writes.map((w) => {
      const next = String((Number(w.version) || 0) + 1);
      return {
        ref: w.ref,
        key: w.key ?? sessionKey(this.prefix, w.ref),
        state: w.state,
        version: w.version,
        next,
        value: `${next}|${encode(w.state)}`,
      };
    });
  }

  /** `writes` as `plan` gave them (else planned here). */
  async save(writes: (SessionWrite | PlannedWrite)[]): Promise<void> {
    if (!writes.length) return;
    const planned = writes.map((w) => ('value' in w ? w : this.plan([w])[0]!));
    const pipe = this.redis.pipeline();
    for (const w of planned)
      invokeScript(pipe, 'writeSessionIfUnchanged', [w.key], [w.version, w.value, this.ttlMs]);
    let replies: unknown[];
    try {
      replies = await execPipeline(pipe, 'session write');
    } catch (err) {
      // Some writes may have landed: no cached entry may stay older than Redis.
      for (const w of planned) this.cache.drop(w.key);
      throw err;
    }
    // Every reply updates the cache before a failure is thrown: a write that landed is cached as the newest.
    let failure: unknown = null;
    for (const [i, w] of planned.entries()) {
      try {
        // `{1}`, the reply of every write that did not race, without a schema parse; any other through the parser.
        const r = replies[i];
        if (!(Array.isArray(r) && r.length === 1 && r[0] === 1))
          parseScriptReply('writeSessionIfUnchanged', r, writtenReply, WRITE_CODES);
        this.cache.written(w.key, w.state, w.next);
      } catch (err) {
        this.cache.drop(w.key);
        failure ??= err;
      }
    }
    if (failure) throw failure;
  }

  /**
   * Writes copied states back (after a Redis loss), each with what is left of its life, unless Redis holds the
   * session at that version or a later one. One pipelined round trip per 1,000 sessions; how many sessions were
   * not in Redis and now are (a later record of one already restored replaces it uncounted).
   */
  async restore(sessions: { ref: SessionRef; value: string; ttlMs: number }[]): Promise<number> {
    let written = 0;
    for (let i = 0; i < sessions.length; i += 1000) {
      const pipe = this.redis.pipeline();
      for (const s of sessions.slice(i, i + 1000))
        invokeScript(pipe, 'restoreSession', [sessionKey(this.prefix, s.ref)], [s.value, s.ttlMs]);
      for (const r of await execPipeline(pipe, 'session restore')) if (r === 1) written++;
    }
    return written;
  }
}

export interface SessionWrite {
  ref: SessionRef;
  state: SessionState;
  /** The version `load` read ('' for a new session). */
  version: string;
  key?: string;
}

export interface PlannedWrite {
  ref: SessionRef;
  key: string;
  state: SessionState;
  version: string;
  next: string;
  value: string;
}
