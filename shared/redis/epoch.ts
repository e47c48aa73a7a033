import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
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

export function createEpoch(redis: Redis, key: string): Epoch {
  let seen: string | null = null;
  return {
    key,
    current: () => seen,
    async check() {
      const fresh = randomUUID();
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
