import { setTimeout as sleep } from 'node:timers/promises';
import { classifyError, type PaverError } from './errors.js';

export interface RetryOptions {
  attempts: number;
  initialMs: number;
  maxMs: number;
  /** Called before each wait; the runner heartbeats here so a long retry does not cost the assignment. */
  onRetry?: (err: PaverError, attempt: number, waitMs: number) => Promise<void> | void;
  shouldStop?: () => boolean;
  /**
   * Called after a retriable failure: while a dependency is known to be down (Redis disconnected, or a replica
   * after a failover), waits until it is back and resolves true, and that failure is not counted as an attempt.
   * Attempts bound failures the runner cannot explain; a dependency it watches has the pause for that.
   */
  hold?: (err: PaverError) => Promise<boolean>;
}

/**
 * Exponential backoff with equal jitter (half the capped delay fixed, half random), retrying only errors
 * classified as retriable. Equal rather than full jitter keeps a floor under each wait, so instances that
 * lost the same dependency spread out without any of them retrying at once.
 */
export async function withRetry<T>(fn: () => Promise<T>, opts: RetryOptions): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (raw) {
      const err = classifyError(raw);
      if (!err.retriable || opts.shouldStop?.()) throw err;
      if (opts.hold && (await opts.hold(err))) {
        if (opts.shouldStop?.()) throw err;
        attempt--;
        continue;
      }
      if (attempt > opts.attempts) throw err;
      const cap = Math.min(opts.maxMs, opts.initialMs * 2 ** (attempt - 1));
      const waitMs = Math.round(cap / 2 + (Math.random() * cap) / 2);
      await opts.onRetry?.(err, attempt, waitMs);
      await sleep(waitMs);
    }
  }
}
