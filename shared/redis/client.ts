import { readFileSync } from 'node:fs';
import { Redis, type RedisOptions } from 'ioredis';
import type { CommonEnv } from '../config.js';
import type { Logger } from '../log.js';
import { pollUntil } from '../poll.js';

/** ioredis from configuration: rediss:// or a CA file turns TLS on; REDIS_USERNAME/REDIS_PASSWORD override the URL's. */
export function createRedis(
  env: CommonEnv,
  log: Logger,
  extra: RedisOptions = {},
  on: { readOnly?: () => void } = {},
): Redis {
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
  // ioredis takes the URL's user and password before any option (the first value of a setting wins), so
  // REDIS_PASSWORD never replaced a password in the URL, and a URL with a user alone (redis://paver@host) sent
  // an empty one. The URL goes without them; both are options, the variables winning.
  const username = env.REDIS_USERNAME ?? decodeURIComponent(url.username);
  const password = env.REDIS_PASSWORD ?? decodeURIComponent(url.password);
  const target = new URL(env.REDIS_URL);
  target.username = '';
  target.password = '';
  let leaving = false;
  const redis = new Redis(target.href, {
    ...(password ? { password } : {}),
    ...(username ? { username } : {}),
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
    // After a failover the name in REDIS_URL (a managed Redis's primary endpoint: ElastiCache, Memorystore,
    // Azure Cache) leads to the new primary, but an open connection stays on the old one, now a replica that
    // refuses every write with READONLY, for as long as it lives. Such a reply makes the connection again, so
    // the name is resolved anew. The command is not sent again (1, not 2): it fails as a transient error and
    // its batch is retried, by then on the new connection.
    // Once per connection: a pipeline's every reply says READONLY, and each would start another disconnect.
    reconnectOnError: (err) => {
      if (!err.message.includes('READONLY')) return false;
      on.readOnly?.();
      if (leaving) return false;
      leaving = true;
      return 1;
    },
    ...extra,
  });
  let wasReady = false;
  redis.on('ready', () => {
    leaving = false;
    if (wasReady) log.info('redis reconnected');
    wasReady = true;
  });
  redis.on('error', (err: Error) => log.warn({ err: err.message }, 'redis connection error'));
  return redis;
}

export const redisReady = (redis: Redis): boolean => redis.status === 'ready';

export type RedisRole = 'primary' | 'replica' | 'unknown';

/** The role a server names itself (`ROLE`'s first element, `INFO replication`'s `role:`). */
const roleNamed = (name: unknown): RedisRole =>
  name === 'slave' || name === 'replica' ? 'replica' : name === 'master' ? 'primary' : 'unknown';

/**
 * What the connected server is, for /readyz: after a failover the address in REDIS_URL may lead to a replica,
 * which answers PING but refuses every write with READONLY. `ROLE` is one O(1) command; a server that refuses
 * it (an ACL without @admin, a managed Redis that renames it) is asked `INFO replication`, and one that refuses
 * both is only pinged, its role `unknown` (ready, as before): a probe must not fail for want of a permission.
 * Whatever worked is remembered, so a refused command is not sent again on every probe.
 */
export function createRoleProbe(redis: Redis, log: Logger): () => Promise<RedisRole> {
  let method: 'role' | 'info' | 'ping' = 'role';
  const refused = (err: unknown) => (err as { name?: unknown } | null)?.name === 'ReplyError';
  const fallBack = (to: 'info' | 'ping', err: unknown) => {
    method = to;
    log.warn(
      { err: (err as Error).message, using: to === 'info' ? 'INFO replication' : 'PING' },
      'redis refused its role query; readiness cannot tell a replica',
    );
  };
  const probe = async (): Promise<RedisRole> => {
    if (method === 'role') {
      try {
        return roleNamed(((await redis.role()) as unknown[])[0]);
      } catch (err) {
        if (!refused(err)) throw err;
        fallBack('info', err);
      }
    }
    if (method === 'info') {
      try {
        return roleNamed(/^role:(\w+)/m.exec(await redis.info('replication'))?.[1]);
      } catch (err) {
        if (!refused(err)) throw err;
        fallBack('ping', err);
      }
    }
    if ((await redis.ping()) !== 'PONG') throw new Error('unexpected PING reply');
    return 'unknown';
  };
  return probe;
}

/** Why Redis is known unable to take writes: a read-only replica, or no answer within the command deadline. */
export type RedisDown = 'replica' | 'unresponsive';

export interface RedisWatch {
  /** From a sign (a READONLY reply, a command timeout, a probe naming a replica) until the role is asked and is fine. */
  down(): RedisDown | null;
  /** A sign: a role a probe found, or `unresponsive` for a command that timed out. */
  note(sign: RedisRole | 'unresponsive'): void;
  stop(): void;
}

/**
 * Whether Redis is known unable to take writes, for the consumer runner. A failover takes seconds to minutes (a
 * manual one longer), a frozen server as long as it is frozen; meanwhile every write fails (READONLY, or the
 * command deadline), and a batch retried on it spent its attempts and then the consumer's restarts, until the
 * process exited and its supervisor restarted it into the same state. Marked at the first sign, the role is
 * asked every `everyMs` (the probe's own single flight, under the same deadline) until the server, or the one
 * the connection was made to again, answers as anything but a replica: consumption pauses and the batch in
 * hand waits, then goes on where it was.
 */
export function createRedisWatch(role: () => Promise<RedisRole>, log: Logger, everyMs = 1_000): RedisWatch {
  let down: RedisDown | null = null;
  let stopped = false;
  let poll: { stop(): void } | null = null;
  const ask = () => {
    let found: RedisRole | null = null;
    poll = pollUntil(
      async () => {
        found = await role();
        if (found !== 'replica') return true;
        down = 'replica';
        return false;
      },
      everyMs,
      () => {
        log.info({ was: down, role: found }, 'redis accepts writes again');
        down = null;
        poll = null;
      },
    );
  };
  return {
    down: () => down,
    note(sign) {
      if (stopped || (sign !== 'replica' && sign !== 'unresponsive')) return;
      // A replica stays a replica until a probe says otherwise; a hang found to be a replica is one.
      if (down === 'replica' || down === sign) return;
      const first = down === null;
      down = sign;
      log.warn(
        { reason: sign },
        sign === 'replica'
          ? 'redis is a read-only replica: consumption waits until it accepts writes'
          : 'redis does not answer within REDIS_COMMAND_TIMEOUT_MS: consumption waits until it does',
      );
      if (first) ask();
    },
    stop() {
      stopped = true;
      poll?.stop();
    },
  };
}

/** What `checkEviction` found: `evicts` when Redis may drop Paver's keys to make room. */
export type EvictionCheck =
  | { outcome: 'ok' | 'unknown'; policy: string | null; maxmemory: number | null }
  | { outcome: 'evicts'; policy: string; maxmemory: number };

/**
 * Paver's state is not a cache: a key Redis evicts to make room (under `maxmemory` with any policy but
 * `noeviction`) goes silently. `allkeys-*` takes keys without a TTL too (the epoch marker, the detector's
 * counts and windows, learned rules, flow candidates), so counts are wrong with nothing to tell; `volatile-*`
 * takes the keys with a TTL (session, task and trace state) before they are due. Nothing noticed either before:
 * this reads `INFO memory` (no @admin needed) once at start-up and warns. A server that refuses it is `unknown`.
 */
export async function checkEviction(redis: Redis, log: Logger): Promise<EvictionCheck> {
  let info: string;
  try {
    info = await redis.info('memory');
  } catch (err) {
    log.debug({ err: (err as Error).message }, 'redis refused INFO memory; eviction policy not checked');
    return { outcome: 'unknown', policy: null, maxmemory: null };
  }
  const policy = /^maxmemory_policy:(\S+)/m.exec(info)?.[1] ?? null;
  const max = /^maxmemory:(\d+)/m.exec(info)?.[1];
  const maxmemory = max === undefined ? null : Number(max);
  if (policy === null || maxmemory === null) return { outcome: 'unknown', policy, maxmemory };
  if (maxmemory === 0 || policy === 'noeviction') return { outcome: 'ok', policy, maxmemory };
  log.warn(
    { maxmemory, policy },
    policy.startsWith('allkeys-')
      ? 'redis evicts any key when full (maxmemory-policy): Paver state (counts, windows, rules, the epoch marker) can vanish silently and be miscounted; set maxmemory-policy noeviction'
      : 'redis evicts keys with a TTL when full (maxmemory-policy): Paver session, task and trace state can vanish before it is due; set maxmemory-policy noeviction',
  );
  return { outcome: 'evicts', policy, maxmemory };
}
