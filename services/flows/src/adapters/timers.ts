import { errorMessage } from '../../../../shared/errors.js';
import type { TableFeed } from '../../../../shared/kafka/table-feed.js';
import type { Logger } from '../../../../shared/log.js';
import type { StateGuard } from '../../../../shared/redis/rebuild.js';
import type { FlowRegistry } from '../core/registry.js';
import type { FlowsEngine } from './engine.js';
import type { LlmConfig } from './llm.js';
import { fillVectors } from './selector.js';

/** Computes the embeddings the registry's flows lack; a failure leaves them to the next call. */
export const vectorRefresher =
  (registry: FlowRegistry, embeddings: LlmConfig, timeoutMs: number, log: Logger) =>
  async (): Promise<void> => {
    await fillVectors(registry, embeddings, timeoutMs).catch((err: unknown) =>
      log.warn({ err: errorMessage(err) }, 'flow embeddings failed; sparse recall only until the next try'),
    );
  };

export interface TimerDeps {
  engine: Pick<FlowsEngine, 'hasOwed' | 'settleOwed' | 'reconcileRegistry'>;
  guard: Pick<StateGuard, 'ready'>;
  feed: Pick<TableFeed, 'isCaughtUp'>;
  registry: Pick<FlowRegistry, 'all'>;
  /** Absent without embeddings (FLOWS_EMBEDDINGS_URL): then no timer refreshes them. */
  refreshVectors?: () => Promise<void>;
  /** FLOWS_RECONCILE_MS (0: no reconciliation) and FLOWS_RECONCILE_MIN_AGE_MS. */
  reconcileMs: number;
  reconcileMinAgeMs: number;
  /** Promoted flows withdrawn by a reconciliation (only called with n > 0). */
  onOrphans: (n: number) => void;
  log: Logger;
}

export interface Timers {
  /** Clears the timers and waits for the runs under way (owed writes, a reconciliation). */
  stop(): Promise<void>;
}

/**
 * `work` every `ms`, one run at a time: a tick that falls due while the last run is still under way is skipped, so
 * a slow Redis does not pile runs up. What `work` throws is logged as `failed` (and tried again at the next tick),
 * never left as an unhandled rejection, which would end the process.
 */
function every(ms: number, work: () => Promise<void>, log: Logger, failed: string) {
  let running: Promise<void> | null = null;
  const timer = setInterval(() => {
    if (running) return;
    running = work()
      .catch((err: unknown) => log.warn({ err: errorMessage(err) }, failed))
      .finally(() => (running = null));
  }, ms).unref();
  return {
    /** Clears the timer and waits for the run under way, so that nothing runs on clients the stop then closes. */
    async stop() {
      clearInterval(timer);
      await running;
    },
    /** Clears the timer only: for work that uses no client the stop closes, and may take long to end. */
    clear() {
      clearInterval(timer);
    },
  };
}

/**
 * The service's background work once started. Set only once start-up has run to its end and the service is still
 * running: a stop may have passed its close() already, and timers set after it would run on closed clients.
 *
 * Both writers wait for `guard.ready()` (a promise: a Redis round trip) and skip the tick unless the state is
 * intact. Against a Redis that lost its state, settling owed writes reads the candidates as absent: it withdraws
 * flows that are promoted and drops the states owed to the state topic; mid-rebuild, a reconciliation would judge
 * the flows topic against a half-restored state. The readiness check itself starts the rebuild, as the `/readyz`
 * probe does, and a later tick finds it done.
 */
export function startTimers(d: TimerDeps): Timers {
  // One refresh at a time, as the writers below: a run embeds the flows still without a vector, 64 per request,
  // each request up to 5 × FLOWS_SELECT_BUDGET_MS, so over a registry that filled after the start (or a slow
  // embeddings endpoint) it outlasts the 30 s. Started again on top of it, each new run asked for the same
  // flows' vectors again (still missing until the first run set them), and the runs piled up.
  const vectors = d.refreshVectors
    ? every(30_000, d.refreshVectors, d.log, 'flow embeddings failed; sparse recall only until the next try')
    : null;
  // Writes that did not land may leave the topics to set right; batches do it first, this when none come.
  const owed = every(
    10_000,
    async () => {
      if (!d.engine.hasOwed || !(await d.guard.ready())) return;
      await d.engine.settleOwed();
    },
    d.log,
    'setting the flows topics right failed; trying again',
  );
  // Anti-entropy: a promotion that published and died before its write leaves a flow the topic should not
  // hold once the candidate is decided otherwise. Only against a state known intact and a registry read
  // to the end.
  const reconcile =
    d.reconcileMs > 0
      ? every(
          d.reconcileMs,
          async () => {
            if (!d.feed.isCaughtUp() || !(await d.guard.ready())) return;
            const n = await d.engine.reconcileRegistry(d.registry.all(), d.reconcileMinAgeMs);
            if (n) {
              d.onOrphans(n);
              d.log.warn({ withdrawn: n }, 'withdrew promoted flows whose candidates were decided otherwise');
            }
          },
          d.log,
          'checking the flows topic against the candidates failed',
        )
      : null;
  return {
    async stop() {
      // Not waited for: it writes to the registry in memory only, and a request may hang up to its timeout.
      vectors?.clear();
      await Promise.all([owed.stop(), reconcile?.stop()]);
    },
  };
}
