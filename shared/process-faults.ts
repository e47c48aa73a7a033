import type { EventEmitter } from 'node:events';
import type { Logger } from './log.js';

/** A fault no code caught: a promise rejected that nobody awaits, or an exception thrown out of a callback. */
export type FaultKind = 'unhandledRejection' | 'uncaughtException';

/** The stop signals a service answers: a supervisor's SIGTERM, an operator's Ctrl-C. */
export const STOP_SIGNALS = ['SIGTERM', 'SIGINT'] as const;
export type StopSignal = (typeof STOP_SIGNALS)[number];

/** What a running service does on a process fault or a stop signal. */
export interface FaultWatcher {
  log: Logger;
  /** The first fault: the same graceful stop as SIGTERM, bounded by PAVER_SHUTDOWN_TIMEOUT_MS, then exit 1. */
  stop: (kind: FaultKind) => void;
  /** A later fault, during that stop: the stop may be what faults, so exit 1 without waiting for it. */
  exitNow: (kind: FaultKind) => void;
  /**
   * SIGTERM or SIGINT, every one of them: the service starts its graceful stop, or says it has already begun. The
   * listener stays while it runs: with `once`, a second signal met Node's default action and killed the process
   * in the middle of its graceful stop, before its commit.
   */
  signal: (sig: StopSignal) => void;
}

/**
 * Message and stack only. The reason of a rejection may be any value, a tool's payload included, so one that
 * is not an Error is named by its type alone.
 */
export function faultFields(reason: unknown): { err: string; stack?: string } {
  if (reason instanceof Error)
    return reason.stack ? { err: reason.message, stack: reason.stack } : { err: reason.message };
  return { err: `a value that is not an Error (${reason === null ? 'null' : typeof reason})` };
}

const WHAT: Record<FaultKind, string> = {
  unhandledRejection: 'unhandled promise rejection',
  uncaughtException: 'uncaught exception',
};

/**
 * One listener per fault kind and per stop signal on `proc`, however many services run in the process (tests
 * start several): a listener per service would pile up past Node's limit of ten (MaxListenersExceededWarning).
 * Installed with the first watcher, removed with the last, so a process whose services have all stopped is back
 * to Node's default (a later SIGTERM ends it at once, as it should with nothing left to stop gracefully).
 * Without a listener, Node 20 ends the process on either fault at once, with a raw stack on stderr: no
 * structured line, and a consumer that never leaves its group (its partitions wait for the session timeout).
 */
export function createFaultHub(proc: Pick<EventEmitter, 'on' | 'off'> = process) {
  const watchers = new Set<FaultWatcher>();
  // Counted from the install: a process whose services all stopped and that starts another starts afresh.
  let faults = 0;
  const listener = (kind: FaultKind) => (reason: unknown) => {
    faults++;
    const first = faults === 1;
    const all = [...watchers];
    // One line per fault, through the oldest service's logger: the fault is the process's, not one service's.
    try {
      all[0]?.log.fatal(
        { kind, ...faultFields(reason) },
        first
          ? `${WHAT[kind]}: stopping gracefully, then exit 1`
          : `${WHAT[kind]} during the stop: exiting now (1)`,
      );
    } catch {
      // A logger that fails must not keep the process from stopping.
    }
    for (const w of all) (first ? w.stop : w.exitNow)(kind);
  };
  const onRejection = listener('unhandledRejection');
  const onException = listener('uncaughtException');
  // Each service keeps its own state (one may be stopping already, on a fatal error of its own), so each is told
  // and decides; a copy, since a service that stops at once may unwatch during the loop.
  const onSignal = (sig: StopSignal) => {
    for (const w of [...watchers]) w.signal(sig);
  };
  return {
    /** Registers `w` until the returned function is called (once its service has stopped). */
    watch(w: FaultWatcher): () => void {
      if (watchers.size === 0) {
        faults = 0;
        proc.on('unhandledRejection', onRejection);
        proc.on('uncaughtException', onException);
        for (const sig of STOP_SIGNALS) proc.on(sig, onSignal);
      }
      watchers.add(w);
      return () => {
        if (!watchers.delete(w) || watchers.size > 0) return;
        proc.off('unhandledRejection', onRejection);
        proc.off('uncaughtException', onException);
        for (const sig of STOP_SIGNALS) proc.off(sig, onSignal);
      };
    },
  };
}

const processHub = createFaultHub();

/**
 * `w` told of this process's unhandled rejections, uncaught exceptions and stop signals (SIGTERM, SIGINT) until
 * the returned function is called.
 */
export const watchProcessFaults = (w: FaultWatcher): (() => void) => processHub.watch(w);
