import { readFileSync } from 'node:fs';
import { Redis, type RedisOptions } from 'ioredis';
import type { CommonEnv } from '../config.js';
import type { Logger } from '../log.js';

/** ioredis from configuration: rediss:// or a CA file turns TLS on; password/username may override the URL's. */
export function createRedis(env: CommonEnv, log: Logger, extra: RedisOptions = {}): Redis {
  const url = new URL(env.REDIS_URL);
  const tls =
    url.protocol === 'rediss:' || env.REDIS_TLS_CA_FILE
      ? {
          rejectUnauthorized: env.REDIS_TLS_REJECT_UNAUTHORIZED,
          ...(env.REDIS_TLS_CA_FILE ? { ca: [readFileSync(env.REDIS_TLS_CA_FILE, 'utf8')] } : {}),
        }
      : undefined;
  if (tls && !env.REDIS_TLS_REJECT_UNAUTHORIZED)
    log.warn(
      { setting: 'REDIS_TLS_REJECT_UNAUTHORIZED' },
      "Redis TLS does not check the server's certificate: anyone between can read and change the traffic",
    );
  const redis = new Redis(env.REDIS_URL, {
    ...(env.REDIS_PASSWORD ? { password: env.REDIS_PASSWORD } : {}),
    ...(env.REDIS_USERNAME ? { username: env.REDIS_USERNAME } : {}),
    ...(tls ? { tls } : {}),
    lazyConnect: true,
    // Commands fail fast while disconnected; the consumer runner pauses and retries batches instead.
    maxRetriesPerRequest: 2,
    enableOfflineQueue: true,
    retryStrategy: (times) => Math.min(times * 200, 5_000),
    // A frozen Redis keeps its connection open: without a deadline a command waits until TCP gives up. The reply
    // that comes late is matched to its timed-out command and dropped, so the connection stays in step. Paver
    // sends no blocking command (BLPOP, XREAD BLOCK, WAIT), which this would cut short.
    commandTimeout: env.REDIS_COMMAND_TIMEOUT_MS,
    ...extra,
  });
  let wasReady = false;
  redis.on('ready', () => {
    if (wasReady) log.info('redis reconnected');
    wasReady = true;
  });
  redis.on('error', (err: Error) => log.warn({ err: err.message }, 'redis connection error'));
  return redis;
}

export const redisReady = (redis: Redis): boolean => redis.status === 'ready';
