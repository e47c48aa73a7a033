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
  /** Clears the timers and waits for a reconciliation under way. */
  stop(): Promise<void>;
}

/**
 * The service's background work once started. Set only once start-up has run to its end and the service is still
 * running: a stop may have passed its close() already, and timers set after it would run on closed clients.
 */
export function startTimers(d: TimerDeps): Timers {
  let reconciling: Promise<void> | null = null;
  const refresh = d.refreshVectors;
  const vectorTimer = refresh ? setInterval(() => void refresh(), 30_000).unref() : null;
  // Writes that did not land may leave the topics to set right; batches do it first, this when none come.
  const owedTimer = setInterval(() => {
    if (!d.engine.hasOwed || !d.guard.ready()) return;
    d.engine
      .settleOwed()
      .catch((err: unknown) =>
        d.log.warn({ err: errorMessage(err) }, 'setting the flows topics right failed; trying again'),
      );
  }, 10_000).unref();
  // Anti-entropy: a promotion that published and died before its write leaves a flow the topic should not
  // hold once the candidate is decided otherwise. Only against a state known intact and a registry read
  // to the end.
  const reconcileTimer =
    d.reconcileMs > 0
      ? setInterval(() => {
          if (reconciling || !d.guard.ready() || !d.feed.isCaughtUp()) return;
          reconciling = d.engine
            .reconcileRegistry(d.registry.all(), d.reconcileMinAgeMs)
            .then((n) => {
              if (n) {
                d.onOrphans(n);
                d.log.warn(
                  { withdrawn: n },
                  'withdrew promoted flows whose candidates were decided otherwise',
                );
              }
            })
            .catch((err: unknown) =>
              d.log.warn(
                { err: errorMessage(err) },
                'checking the flows topic against the candidates failed',
              ),
            )
            .finally(() => (reconciling = null));
        }, d.reconcileMs).unref()
      : null;
  return {
    async stop() {
      if (vectorTimer) clearInterval(vectorTimer);
      clearInterval(owedTimer);
      if (reconcileTimer) clearInterval(reconcileTimer);
      await reconciling;
    },
  };
}
