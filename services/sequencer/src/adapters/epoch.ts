import type { Redis } from 'ioredis';
import type { Epoch } from '../../../../shared/redis/epoch.js';
import { redisFailure } from '../../../../shared/redis/replies.js';
import type { Logger } from '../../../../shared/log.js';

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

const INVALIDATE = '__redis__:invalidate';
/** After a failed attempt to set tracking up, reads use the GET for this long before the next attempt. */
const REARM_AFTER_MS = 1_000;
/** Doubled after each failure in a row, up to this: a server that keeps failing is not sent 2 connections a second. */
const REARM_MAX_MS = 60_000;

export interface TrackedEpoch extends Epoch {
  /** True while checks cost no Redis command: tracking set up, nothing invalidated, the connection heard from. */
  tracking(): boolean;
  close(): void;
}

/**
 * The epoch check at no Redis command per read in the common case, using Redis's client-side caching: a
 * connection of its own reads the marker with `CLIENT TRACKING` on, redirecting invalidations to a second
 * connection subscribed to `__redis__:invalidate`. Redis then says when the marker changes or goes (a `DEL`, a
 * `SET` by another instance, a `FLUSHALL`/`FLUSHDB`, which invalidates everything), and a check answers from
 * what it last read until then. What tracking cannot say is covered too:
 * - a restart or a failover closes the connections (they do not reconnect), and so does a killed one: a
 *   redirect to a connection that is gone would lose invalidations silently;
 * - a connection that goes silent (a network partition, a frozen server, a middlebox that dropped an idle one)
 *   is answered only while a `PING` on each of the two every `heartbeatMs / 2` came back within the last
 *   `heartbeatMs`.
 * Outside those conditions, or where the server refuses tracking (an ACL without `CLIENT` or the channel, an old
 * Redis), every check is the `GET` of `cheapEpochCheck`, and tracking is set up again after a check that found
 * nothing lost. A loss is so noticed within the time its invalidation takes to arrive, where the `GET` noticed it
 * within one round trip: at most `heartbeatMs` later for a silent connection, when a cached state may answer for
 * that long (it is what this instance wrote, and what the restore writes back).
 */
export function trackedEpochCheck(
  redis: Redis,
  full: Epoch,
  o: { heartbeatMs: number; log: Logger },
): TrackedEpoch {
  const cheap = cheapEpochCheck(redis, full);
  if (o.heartbeatMs <= 0) return { ...cheap, tracking: () => false, close: () => undefined };
  let armed: { epoch: string; heard: number } | null = null;
  let pair: { sub: Redis; trk: Redis; timer: NodeJS.Timeout } | null = null;
  // Bumped by every drop: an answer that arrives after one belongs to connections that are gone.
  let generation = 0;
  let arming = false;
  let beating = false;
  let retryAt = 0;
  let refused = false;
  let failures = 0;
  let closed = false;

  // A monotonic clock: the wall clock set back (an NTP step, a VM resumed) would make a heartbeat heard before
  // it look fresh for as long as the step, while nothing answers.
  const fresh = () => armed !== null && performance.now() - armed.heard <= o.heartbeatMs;

  function drop(): void {
    generation++;
    armed = null;
    const p = pair;
    pair = null;
    if (!p) return;
    clearInterval(p.timer);
    p.sub.disconnect();
    p.trk.disconnect();
  }

  function beat(): void {
    const p = pair;
    if (!p || !armed || beating) return;
    beating = true;
    const gen = generation;
    // Both connections. The invalidations come on `sub` alone, and it carries nothing while the marker holds:
    // one the server dropped without the client hearing (a NAT or load balancer that forgot the idle
    // connection) leaves the redirect going nowhere, and Redis drops the marker's invalidation silently (RESP2
    // says nothing to the tracking connection), while `trk` answers on. A PONG on `sub` also comes after every
    // invalidation the server sent before it, on the same connection.
    Promise.all([p.trk.ping(), p.sub.ping()])
      .then(
        () => {
          if (gen === generation && armed) armed.heard = performance.now();
        },
        () => {
          if (gen === generation) drop();
        },
      )
      .finally(() => (beating = false));
  }

  async function arm(): Promise<void> {
    if (arming || pair || refused || closed || performance.now() < retryAt) return;
    arming = true;
    const gen = ++generation;
    // No reconnection: a connection made again is a new client, without tracking or with a redirect to nothing.
    const opts = {
      lazyConnect: true,
      retryStrategy: () => null,
      maxRetriesPerRequest: 0,
      reconnectOnError: null,
    };
    const sub = redis.duplicate(opts);
    const trk = redis.duplicate(opts);
    const timer = setInterval(beat, Math.max(1, Math.floor(o.heartbeatMs / 2)));
    timer.unref();
    pair = { sub, trk, timer };
    for (const c of [sub, trk]) {
      c.on('error', () => undefined);
      c.on('close', () => {
        if (pair?.sub === sub) drop();
      });
    }
    // The tracking connection reads the marker alone, so any invalidation is the marker's (or everything's).
    sub.on('message', (channel: string) => {
      if (channel === INVALIDATE && pair?.sub === sub) drop();
    });
    try {
      await Promise.all([sub.connect(), trk.connect()]);
      const id = await sub.client('ID');
      await sub.subscribe(INVALIDATE);
      await trk.client('TRACKING', 'ON', 'REDIRECT', String(id));
      const value = await trk.get(full.key);
      if (gen !== generation) return;
      // Changed since the check that found nothing lost: the next check's GET says what happened.
      if (value === null || value !== full.current()) return drop();
      armed = { epoch: value, heard: performance.now() };
      if (failures > 0) o.log.info('client-side tracking of the epoch marker set up again');
      failures = 0;
    } catch (err) {
      if (gen === generation) drop();
      const message = err instanceof Error ? err.message : String(err);
      if (/NOPERM|no permissions|unknown (sub)?command/i.test(message)) {
        refused = true;
        o.log.info(
          { err: message },
          'redis refused client-side tracking (needs CLIENT and the __redis__:invalidate channel): every allowed-tools read checks the epoch marker with a GET',
        );
      } else {
        failures++;
        retryAt = performance.now() + Math.min(REARM_MAX_MS, REARM_AFTER_MS * 2 ** (failures - 1));
        // Once per run of failures: each is retried with a longer wait, and reads are answered meanwhile.
        if (failures === 1)
          o.log.warn(
            { err: message },
            'client-side tracking of the epoch marker could not be set up: every allowed-tools read checks the marker with a GET until it is (tried again with backoff, up to a minute apart)',
          );
      }
    } finally {
      arming = false;
    }
  }

  return {
    key: full.key,
    current: () => full.current(),
    tracking: fresh,
    async check() {
      if (armed && armed.epoch !== full.current()) drop();
      if (fresh()) return { lost: false, epoch: armed!.epoch };
      const r = await cheap.check();
      if (!r.lost && !pair) void arm();
      return r;
    },
    close() {
      closed = true;
      drop();
    },
  };
}
