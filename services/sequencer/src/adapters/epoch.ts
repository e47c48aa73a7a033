import type { Redis } from 'ioredis';
import type { Epoch } from '../../../../shared/redis/epoch.js';
import { redisFailure } from '../../../../shared/redis/replies.js';

/**
 * The epoch check at the price of one `GET` when nothing changed: every allowed-tools read checks the marker
 * (a state cached before a Redis loss must not answer), and the full check (`createEpoch`: a MULTI of SET NX
 * and GET, with a fresh UUID) costs four commands, a transaction object and the UUID on every read. A `GET`
 * that returns the value this process last saw proves what the full check would: the marker is there and
 * unchanged, so nothing was lost. Any other answer (missing, replaced, or no check yet) goes to the full check,
 * which recreates the marker and says `lost`; a marker recreated by another instance between the two is seen
 * there as replaced, so a loss is never missed.
 */
export function cheapEpochCheck(redis: Redis, full: Epoch): Epoch {
  return {
    key: full.key,
    current: () => full.current(),
    async check() {
      const seen = full.current();
      if (seen !== null) {
        let value: string | null;
        try {
          value = await redis.get(full.key);
        } catch (err) {
          throw redisFailure(`epoch marker ${full.key}`, err);
        }
        if (value === seen) return { lost: false, epoch: value };
      }
      return full.check();
    },
  };
}
