import { EventEmitter } from 'node:events';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import {
  createFaultHub,
  faultFields,
  STOP_SIGNALS,
  watchProcessFaults,
  type FaultKind,
  type StopSignal,
} from '../../shared/process-faults.js';

/** A watcher whose logger keeps its lines, and which records what it was told. */
function watcher() {
  const lines: Record<string, unknown>[] = [];
  const told: string[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return {
    lines,
    told,
    w: {
      log,
      stop: (k: FaultKind) => void told.push(`stop ${k}`),
      exitNow: (k: FaultKind) => void told.push(`exitNow ${k}`),
      signal: (sig: StopSignal) => void told.push(`signal ${sig}`),
    },
  };
}

describe('process faults', () => {
  it('the first fault stops every service gracefully, a later one exits at once; one line per fault', () => {
    const proc = new EventEmitter();
    const hub = createFaultHub(proc);
    const a = watcher();
    const b = watcher();
    const offA = hub.watch(a.w);
    const offB = hub.watch(b.w);
    proc.emit('unhandledRejection', new Error('boom'), Promise.resolve());
    expect(a.told).toEqual(['stop unhandledRejection']);
    expect(b.told).toEqual(['stop unhandledRejection']);
    proc.emit('uncaughtException', new Error('again'), 'uncaughtException');
    expect(a.told).toEqual(['stop unhandledRejection', 'exitNow uncaughtException']);
    expect(b.told).toEqual(['stop unhandledRejection', 'exitNow uncaughtException']);
    // The fault is the process's: logged once, through the oldest service's logger.
    expect(b.lines).toEqual([]);
    expect(a.lines.map((l) => [l.level, l.kind, l.err])).toEqual([
      [60, 'unhandledRejection', 'boom'],
      [60, 'uncaughtException', 'again'],
    ]);
    expect(a.lines[0]?.msg).toContain('stopping gracefully');
    expect(a.lines[1]?.msg).toContain('exiting now');
    expect(a.lines[0]?.stack).toMatch(/^Error: boom\n\s+at /);
    offA();
    offB();
  });

  it('a rejection with a value that is not an Error logs its type only, never the value (it may be a payload)', () => {
    const proc = new EventEmitter();
    const a = watcher();
    const off = createFaultHub(proc).watch(a.w);
    proc.emit('unhandledRejection', { args: { card: '4111 1111 1111 1111' } }, Promise.resolve());
    expect(JSON.stringify(a.lines)).not.toContain('4111');
    expect(a.lines[0]?.err).toBe('a value that is not an Error (object)');
    expect(faultFields('secret text')).toEqual({ err: 'a value that is not an Error (string)' });
    expect(faultFields(null)).toEqual({ err: 'a value that is not an Error (null)' });
    off();
  });

  it('one listener per kind however many services, removed with the last; a new first service starts afresh', () => {
    const proc = new EventEmitter();
    const hub = createFaultHub(proc);
    const all = Array.from({ length: 25 }, () => watcher());
    const offs = all.map((x) => hub.watch(x.w));
    expect(proc.listenerCount('unhandledRejection')).toBe(1);
    expect(proc.listenerCount('uncaughtException')).toBe(1);
    proc.emit('unhandledRejection', new Error('first'), Promise.resolve());
    offs.forEach((off) => off());
    offs[0]!(); // twice: harmless
    expect(proc.listenerCount('unhandledRejection')).toBe(0);
    expect(proc.listenerCount('uncaughtException')).toBe(0);
    const later = watcher();
    const off = hub.watch(later.w);
    proc.emit('unhandledRejection', new Error('in the next service'), Promise.resolve());
    expect(later.told).toEqual(['stop unhandledRejection']);
    off();
  });

  it('every SIGTERM and SIGINT reaches every service, each time, through one listener per signal', () => {
    const proc = new EventEmitter();
    const hub = createFaultHub(proc);
    const all = Array.from({ length: 25 }, () => watcher());
    const offs = all.map((x) => hub.watch(x.w));
    expect(STOP_SIGNALS.map((sig) => proc.listenerCount(sig))).toEqual([1, 1]);
    proc.emit('SIGTERM', 'SIGTERM');
    // The second signal too: each service says it is already stopping (what it did with its own listener).
    proc.emit('SIGINT', 'SIGINT');
    for (const x of all) expect(x.told).toEqual(['signal SIGTERM', 'signal SIGINT']);
    // A signal is no fault: the next fault is still the first, a graceful stop.
    proc.emit('uncaughtException', new Error('after'), 'uncaughtException');
    expect(all[0]!.told.at(-1)).toBe('stop uncaughtException');
    offs.forEach((off) => off());
    expect(STOP_SIGNALS.map((sig) => proc.listenerCount(sig))).toEqual([0, 0]);
  });

  it('a service that unwatches during a signal (its own or another that stops with it) keeps no one from hearing it', () => {
    const proc = new EventEmitter();
    const hub = createFaultHub(proc);
    // The first stops at once on the signal and unwatches, and with it a service it owns, watched after it
    // (one stopped synchronously by its owner): every service watched when the signal came is told all the same.
    const owned = watcher();
    const later = watcher();
    const offs: (() => void)[] = [];
    offs.push(
      hub.watch({
        ...watcher().w,
        signal: () => {
          offs[0]!();
          offs[1]!();
        },
      }),
    );
    offs.push(hub.watch(owned.w));
    offs.push(hub.watch(later.w));
    proc.emit('SIGTERM', 'SIGTERM');
    expect(owned.told).toEqual(['signal SIGTERM']);
    expect(later.told).toEqual(['signal SIGTERM']);
    // Unwatched, the owned one hears no later signal; the listeners stay while one service is watched.
    proc.emit('SIGINT', 'SIGINT');
    expect(owned.told).toEqual(['signal SIGTERM']);
    expect(later.told).toEqual(['signal SIGTERM', 'signal SIGINT']);
    offs[2]!();
    expect(STOP_SIGNALS.map((sig) => proc.listenerCount(sig))).toEqual([0, 0]);
  });

  it("on the real process: one listener each while watched, none left after (vitest's own are kept)", () => {
    const events = ['unhandledRejection', 'uncaughtException', ...STOP_SIGNALS];
    const before = events.map((e) => process.listenerCount(e));
    const offs = Array.from({ length: 12 }, () => watchProcessFaults(watcher().w));
    expect(events.map((e) => process.listenerCount(e))).toEqual(before.map((n) => n + 1));
    offs.forEach((off) => off());
    expect(events.map((e) => process.listenerCount(e))).toEqual(before);
  });
});
