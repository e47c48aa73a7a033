import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { PaverError } from '../errors.js';
import { redisFailure } from './replies.js';

/**
 * Redis-loss detection. Each service keeps a marker key (no TTL) whose random value names the "epoch" of its
 * Redis state. A FLUSHALL, an empty Redis after a restart without persistence, or a failover to an empty
 * replica removes the marker with the state; the next `check()` sees it missing (or replaced by another
 * instance that noticed first) and reports `lost`, and the service rebuilds from Kafka.
 *
 * A process's first check that finds no marker also reports `lost`: Paver cannot tell "never ran" from "state
 * gone", and a rebuild of nothing costs nothing. Keep the marker out of eviction (`noeviction` or a
 * `volatile-*` policy); an evicted marker only costs a needless rebuild.
 */
export interface EpochCheck {
  /** True when the state this process relied on is gone (or was never there): rebuild before writing. */
  lost: boolean;
  epoch: string;
}

export interface Epoch {
  readonly key: string;
  /** The epoch this process last saw, or null before the first check. */
  current(): string | null;
  /** Reads the marker, creating it when missing; `lost` when it differs from what this process last saw. */
  check(): Promise<EpochCheck>;
}

/**
 * The key of a restore flag set with the marker (`createEpoch`'s `flag`): it shares the marker's hash slot (the
 * marker's whole name as its hash tag: prefixes hold no braces), so one script can set both on a cluster, and it
 * begins with the marker's name, so with the key prefix: an ACL that grants `~<prefix>:*` covers it.
 */
export const restoreFlagKey = (marker: string): string => `${marker}:{${marker}}:restoring`;

/** Creates the marker if missing and then sets the flag; the marker's value either way. */
const CREATE_WITH_FLAG = `if redis.call('SET', KEYS[1], ARGV[1], 'NX') then redis.call('SET', KEYS[2], ARGV[2]) end
return redis.call('GET', KEYS[1])`;

/**
 * `flag`: a key set in the same step as the marker is created (`restoreFlagKey`), for a service that restores its
 * state from a copy: every instance that starts before the restore is done sees the flag, not only the one whose
 * check created the marker. The restore deletes it when done.
 */
export function createEpoch(redis: Redis, key: string, flag?: string): Epoch {
  let seen: string | null = null;
  return {
    key,
    current: () => seen,
    async check() {
      const fresh = randomUUID();
      if (flag !== undefined) {
        let value: unknown;
        try {
          value = await redis.eval(CREATE_WITH_FLAG, 2, key, flag, fresh, String(Date.now()));
        } catch (err) {
          throw redisFailure(`epoch marker ${key}`, err);
        }
        const lost = value === fresh || (seen !== null && value !== seen);
        seen = String(value);
        return { lost, epoch: seen };
      }
      let replies: [Error | null, unknown][] | null;
      try {
        // One round trip, atomic: create the marker if missing, then read it (works on Redis 6, unlike SET NX GET).
        replies = await redis.multi().set(key, fresh, 'NX').get(key).exec();
      } catch (err) {
        throw redisFailure(`epoch marker ${key}`, err);
      }
      const failed = replies?.find(([e]) => e)?.[0];
      if (!replies || failed)
        throw redisFailure(`epoch marker ${key}`, failed ?? new Error('transaction aborted'));
      const created = replies[0]![1] === 'OK';
      const value = String(replies[1]![1]);
      const lost = created || (seen !== null && value !== seen);
      seen = value;
      return { lost, epoch: value };
    },
  };
}

/** The epoch marker as a service's guard last saw it (`value` null before its first check: nothing to compare). */
export interface EpochMarker {
  key: string;
  value: string | null;
}

/**
 * A batch whose reads met a Redis loss (between the guard's check and the reads: the marker read after them is
 * gone or another) would write fresh state that a restore then leaves alone, or overwrites. It is retried
 * instead, and the guard restores first.
 */
export const stateLostMidRead = (): PaverError =>
  new PaverError(
    'STATE_CONTENDED',
    'Redis lost its state while the batch read it: read again after the restore',
  );
