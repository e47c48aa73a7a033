import { errorMessage, PaverError } from '../errors.js';
import type { Logger } from '../log.js';
import type { Redis } from 'ioredis';
import type { Epoch } from './epoch.js';

export type RebuildReason = 'start' | 'lost';

/**
 * Guards a service's Redis state with its epoch marker (`createEpoch`): `ensure()` before the state is used
 * rebuilds it from Kafka when the marker says it is gone, and `ready()` is the `/readyz` check (false while a
 * rebuild runs, or when this very probe finds the state gone, which starts the rebuild).
 *
 * - One rebuild at a time, and every caller of `ensure()` waits for it: nothing reads or writes half-rebuilt
 *   state. Checks are single-flight too, so a second caller cannot pass on a marker the first just recreated.
 * - A rebuild that fails stays owed (the marker is already back, so the next check alone would not say so)
 *   and is retried by the next `ensure()`.
 * - The first `ensure()` of a process always rebuilds (`start`): a process that died mid-rebuild left the
 *   marker behind with the state incomplete, and a rebuild must therefore be cheap and idempotent.
 * - Once `goOn` is false (the service stopping), no rebuild starts, and the one running is given up: the
 *   rebuild gets `goOn` to end early (a replay's `goOn`, ending in `ReplayStopped`), and whatever it then
 *   fails with is `RebuildStopped` (SHUTTING_DOWN), so a batch waiting in `ensure()` ends uncommitted as
 *   `stopped` and the stop does not wait for the rebuild. It stays owed: a restore under its flag
 *   (`flaggedRestore`) leaves the flag, and the next start restores again.
 */
export interface StateGuard {
  ensure(): Promise<void>;
  ready(): Promise<boolean>;
  rebuilding(): boolean;
}

export type RebuildOutcome = 'ok' | 'failed' | 'stopped';

export interface StateGuardSpec {
  epoch: Epoch;
  log: Logger;
  /**
   * Must be idempotent and must not overwrite state newer than what it restores. `goOn` turns false when the
   * service begins to stop: a long rebuild asks it (or passes it to its replay) and gives up then.
   */
  rebuild: (reason: RebuildReason, goOn: () => boolean) => Promise<void>;
  onRebuild?: (reason: RebuildReason, outcome: RebuildOutcome) => void;
  /** The service's `isRunning`: false once it begins to stop. */
  goOn?: () => boolean;
}

/** A rebuild given up, or not begun, because the service is stopping: still owed, done again at the next start. */
export class RebuildStopped extends PaverError {
  constructor(cause?: unknown) {
    super(
      'SHUTTING_DOWN',
      'redis state rebuild stopped: the service is stopping',
      cause === undefined ? undefined : { cause },
    );
  }
}

/**
 * `work` unless `goOn` turns false first (asked every 100 ms): then `RebuildStopped`. For a rebuild's waits that
 * take no `goOn` of their own (a table read to its end, say); the work itself is left to end on its own.
 */
export async function whileGoingOn<T>(goOn: () => boolean, work: Promise<T>): Promise<T> {
  // Left behind by a stop, its failure is nobody's to report.
  work.catch(() => undefined);
  if (!goOn()) throw new RebuildStopped();
  let timer: NodeJS.Timeout | undefined;
  const stopped = new Promise<never>((_, reject) => {
    timer = setInterval(() => {
      if (!goOn()) reject(new RebuildStopped());
    }, 100);
  });
  try {
    return await Promise.race([work, stopped]);
  } finally {
    clearInterval(timer);
  }
}

export function createStateGuard(s: StateGuardSpec): StateGuard {
  const goOn = s.goOn ?? (() => true);
  let owed: RebuildReason | null = 'start';
  let checking: Promise<void> | null = null;
  let running: Promise<void> | null = null;

  const check = () =>
    (checking ??= (async () => {
      const c = await s.epoch.check();
      if (c.lost && !owed) {
        owed = 'lost';
        s.log.warn({ marker: s.epoch.key }, 'redis state lost (epoch marker gone); rebuilding from kafka');
      }
    })().finally(() => (checking = null)));

  const rebuild = () =>
    (running ??= (async () => {
      const reason = owed!;
      owed = null;
      const t0 = Date.now();
      try {
        await s.rebuild(reason, goOn);
        s.onRebuild?.(reason, 'ok');
        s.log.info({ reason, ms: Date.now() - t0 }, 'redis state rebuilt from kafka');
      } catch (err) {
        owed ??= reason;
        // Whatever ended it once the stop began (a replay given up, a Redis connection the stop closed): the
        // stop's doing, not a failure, and SHUTTING_DOWN for the batch that waits.
        if (!goOn()) {
          s.onRebuild?.(reason, 'stopped');
          s.log.info(
            { reason, ms: Date.now() - t0 },
            'redis state rebuild stopped by the stop; it is done again at the next start',
          );
          throw err instanceof RebuildStopped ? err : new RebuildStopped(err);
        }
        s.onRebuild?.(reason, 'failed');
        s.log.error({ reason, err: errorMessage(err) }, 'redis state rebuild failed; retried on next use');
        throw err;
      }
    })().finally(() => (running = null)));

  return {
    async ensure() {
      // Loop: the state may be lost again while a rebuild runs; the check after it says so.
      for (;;) {
        // Another caller's rebuild: its failure is that caller's to report; this one retries what is owed.
        if (running) await running.catch(() => undefined);
        // A rebuild the stop gave up is still owed: no caller may pass on it, nor start it again.
        if (owed && !goOn()) throw new RebuildStopped();
        await check();
        // Callers waiting on one check resume in turn: the first may have started the rebuild (and taken what
        // was owed) before this one looks. It must wait for that rebuild, not pass as if nothing were owed.
        if (running) continue;
        if (!owed) return;
        if (!goOn()) throw new RebuildStopped();
        await rebuild();
      }
    },
    async ready() {
      if (running) return false;
      await check();
      if (running) return false;
      if (!owed) return true;
      if (goOn()) rebuild().catch(() => undefined);
      return false;
    },
    rebuilding: () => running !== null,
  };
}

/**
 * Runs a restore under its flag (`restoreFlagKey`, no TTL; set with the marker when the marker is created, and
 * again here), deleted after it: a process that dies mid-restore leaves the flag, and `restoreCutShort` tells
 * the next start (and any instance starting meanwhile) to restore too.
 */
export async function flaggedRestore<T>(redis: Redis, flag: string, restore: () => Promise<T>): Promise<T> {
  await redis.set(flag, String(Date.now()));
  const r = await restore();
  await redis.del(flag);
  return r;
}
export const restoreCutShort = async (redis: Redis, flag: string): Promise<boolean> =>
  (await redis.exists(flag)) === 1;

/**
 * `guard.ensure()` for a batch handler: the consumer heartbeats while it waits, so a restore longer than the
 * session timeout does not cost it its group membership (and every instance a rebalance).
 */
export async function ensureHeartbeating(
  guard: StateGuard,
  heartbeat: () => Promise<void>,
  everyMs = 1000,
): Promise<void> {
  const timer = setInterval(() => void heartbeat().catch(() => undefined), everyMs);
  try {
    await guard.ensure();
  } finally {
    clearInterval(timer);
  }
}
