import type { Redis } from 'ioredis';
import type { Counter, Gauge } from 'prom-client';
import { errorMessage } from '../../../../shared/errors.js';
import { messageBytes } from '../../../../shared/kafka/dead-letter.js';
import type { ReplayOptions } from '../../../../shared/kafka/replay.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { flaggedRestore, RebuildStopped } from '../../../../shared/redis/rebuild.js';
import type { Logger } from '../../../../shared/log.js';
import { scopeId } from '../core/learn/engine.js';
import { contextRecordKey, contextRecordValue, scopeRecordKey, scopeRecordValue } from './kafka/rules-log.js';
import { readRulesLog, restoreVerdict, type ScopeCopyRead } from './kafka/rules-log.js';
import {
  metaCopy,
  raiseForgets,
  readContexts,
  restoreScope,
  type ContextsWritten,
} from './redis/learn-store.js';
import { ScopeLeases } from './redis/scope-lease.js';
import { StaleFenceFailed, type ScopeRetirement } from './scope-retire.js';

/** Scopes copied per round trip (and per set of leases held at once). */
const SCOPES_PER_ROUND = 32;
/** Scopes whose oversize record this process remembers having warned about; past it, it starts over. */
const WARNED_MAX = 10_000;
/** Scopes whose failed stale-copy fence this process keeps to try again; past it, new ones are not kept. */
const UNFENCED_MAX = 10_000;

export interface RuleSnapshotsSpec {
  redis: Redis;
  prefix: string;
  sink: Sink;
  topic: string;
  /**
   * PAVER_MAX_OUTPUT_BYTES, as the broker counts a record (`messageBytes`): a context's record above it is left
   * out (a tombstone in its place), a scope record goes without its families' evidence, or, if even that is
   * above it, the scope is left out of the copy (counted, logged without content).
   */
  maxRecordBytes: number;
  leaseMs: number;
  log: Logger;
  /** While true (a restore runs), nothing is copied: the marks wait. */
  paused: () => boolean;
  /** Registers the scopes copied, under their leases (`ScopeRetirement.register`); absent: no registry. */
  register?: (scopes: readonly { tenant: string; agent: string }[]) => Promise<void>;
  /**
   * A copy whose send outlasted its leases: the scopes it copied are handed to `ScopeRetirement.afterStaleCopy`
   * (tombstoned again at once where Redis has not lost them), since one retired or forgotten meanwhile would keep
   * the records that landed after its tombstones for ever; a live one keeps what it holds.
   */
  requeue?: (scopes: ContextsWritten[]) => Promise<unknown>;
  metrics: {
    records: Counter<'kind'>;
    pending: Gauge;
    flushes: Counter<'outcome'>;
  };
}

/**
 * Copies the learned state's changes to the rules topic, off the batch path: a batch marks the contexts its
 * save set or deleted; every interval the marked contexts are read (under their scopes' leases, so each
 * scope reads as one batch left it and copies land in the order of the writes they copy) and published,
 * with the scope's clock. A context changed by many batches in an interval is published once.
 *
 * What the topic lacks after a loss: the changes of the last interval (and those an instance marked and then
 * died with before copying). The rules are statistics: a restored rule is at most that far behind.
 */
export class RuleSnapshots {
  private marks = new Map<string, { tenant: string; agent: string; ctxs: Set<string> }>();
  private flushing: Promise<void> | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  /** Contexts taken by the copy under way and not yet published. */
  private inFlight = 0;
  /**
   * The scopes whose record was trimmed or left out, and warned about: a scope whose record is over the limit is
   * so at every copy of it (every interval while it learns), and a warning each time drowned the log. The metric
   * counts every one; the warning comes once per scope, and again once its record has fitted whole meanwhile.
   */
  private readonly warned = new Set<string>();
  /**
   * Stale copies whose fence failed (`requeue` threw), tried again at the next copy. Without it, at
   * AUTOSEQ_LEARN_SCOPE_TTL_MS=0 (no sweep) nothing did: the copy's records stayed on the topic, and those of
   * contexts the scope did not learn again came back with it at a restore once it was copied again.
   */
  private unfenced = new Map<string, ContextsWritten>();
  /** Whether the cap on `unfenced` has been warned about (once per copier). */
  private unfencedCapWarned = false;

  constructor(private readonly s: RuleSnapshotsSpec) {}

  mark(written: readonly ContextsWritten[]): void {
    for (const w of written) {
      const id = scopeId(w.tenant, w.agent);
      let m = this.marks.get(id);
      if (!m) this.marks.set(id, (m = { tenant: w.tenant, agent: w.agent, ctxs: new Set() }));
      for (const c of w.ctxs) m.ctxs.add(c);
    }
    this.s.metrics.pending.set(this.pending());
  }

  /** Contexts marked and not yet copied (those of the copy under way included). */
  pending(): number {
    let n = this.inFlight;
    for (const m of this.marks.values()) n += m.ctxs.size;
    return n;
  }

  start(intervalMs: number): void {
    const tick = () => {
      this.timer = setTimeout(() => {
        void this.flush().finally(() => {
          if (!this.stopped) tick();
        });
      }, intervalMs);
      this.timer.unref();
    };
    tick();
  }

  /** A last copy of what is marked (graceful stop, after the consumer's last batch). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    // A copy under way took only the marks made before it: the last batches' marks need one of their own.
    await this.flushing;
    await this.flush();
  }

  /** Copies what is marked now; a failure keeps the marks for the next try (logged, counted). One at a time. */
  flush(): Promise<void> {
    return (this.flushing ??= this.copy().finally(() => (this.flushing = null)));
  }

  private async copy(): Promise<void> {
    if (this.s.paused()) return;
    await this.fenceAgain();
    if (this.marks.size === 0) return;
    const todo = [...this.marks.values()];
    this.marks = new Map();
    for (const m of todo) this.inFlight += m.ctxs.size;
    let done = 0;
    try {
      while (done < todo.length) {
        const round = todo.slice(done, done + SCOPES_PER_ROUND);
        await this.copyRound(round.map((m) => ({ tenant: m.tenant, agent: m.agent, ctxs: [...m.ctxs] })));
        done += round.length;
        for (const m of round) this.inFlight -= m.ctxs.size;
        this.s.metrics.pending.set(this.pending());
      }
      this.s.metrics.flushes.inc({ outcome: 'ok' });
    } catch (err) {
      // Marks made meanwhile stay; the ones not copied go back beside them.
      this.inFlight = 0;
      for (const m of todo.slice(done)) this.mark([{ tenant: m.tenant, agent: m.agent, ctxs: [...m.ctxs] }]);
      this.s.metrics.flushes.inc({ outcome: 'failed' });
      this.s.log.warn(
        { err: errorMessage(err), contexts: this.pending() },
        'learned rules not copied to the rules topic; trying again',
      );
    } finally {
      this.s.metrics.pending.set(this.pending());
    }
  }

  /**
   * The failed fences again. Their contexts are marked too: a scope that came back meanwhile is the copier's (the
   * fence spares it), and its copy sends a tombstone for each of them it does not hold; one without state is
   * skipped by the copy and tombstoned by the fence.
   */
  private async fenceAgain(): Promise<void> {
    if (this.unfenced.size === 0 || !this.s.requeue) return;
    const list = [...this.unfenced.values()];
    this.unfenced = new Map();
    this.mark(list);
    try {
      await this.s.requeue(list);
    } catch (err) {
      const owed = owedFence(err, list);
      this.leftUnfenced(owed);
      this.s.log.warn(
        { err: errorMessage(fenceCause(err)), scopes: owed.length },
        "a stale copy's scopes not fenced again; trying at the next copy",
      );
    }
  }

  private leftUnfenced(scopes: readonly ContextsWritten[]): void {
    let dropped = 0;
    for (const w of scopes) {
      const id = scopeId(w.tenant, w.agent);
      const u = this.unfenced.get(id);
      // Bounded while Kafka stays down: at TTL > 0 the sweep still has the scopes dropped (their `fence` sets), and at
      // TTL 0 their forget markers keep a restore from writing them back.
      if (!u && this.unfenced.size >= UNFENCED_MAX) {
        dropped++;
        continue;
      }
      this.unfenced.set(id, {
        tenant: w.tenant,
        agent: w.agent,
        ctxs: u ? [...new Set([...u.ctxs, ...w.ctxs])] : [...w.ctxs],
      });
    }
    if (dropped > 0 && !this.unfencedCapWarned) {
      this.unfencedCapWarned = true;
      this.s.log.warn(
        { dropped, kept: this.unfenced.size },
        "stale copies' failed fences past the cap: not kept to try again (warned once)",
      );
    }
  }

  /** Whether `scope`'s oversize record of this kind is news (not warned about since it last fitted). */
  private firstWarning(kind: 'trimmed' | 'left_out', scope: string): boolean {
    const key = `${kind} ${scope}`;
    if (this.warned.has(key)) return false;
    // Bounded: where scope ids come and go, forgetting them all costs one more warning each, not memory.
    if (this.warned.size >= WARNED_MAX) this.warned.clear();
    this.warned.add(key);
    return true;
  }

  private fitted(kind: 'trimmed' | 'left_out', scope: string): void {
    this.warned.delete(`${kind} ${scope}`);
  }

  private async copyRound(scopes: ContextsWritten[]): Promise<void> {
    const { redis, prefix } = this.s;
    const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
    const refs = scopes.map((s) => ({ id: scopeId(s.tenant, s.agent), tenant: s.tenant, agent: s.agent }));
    await leases.acquire(refs);
    try {
      const copies = await readContexts(redis, prefix, scopes);
      const records: { key: string; value: string | null }[] = [];
      const kinds = { context: 0, tombstone: 0, too_large: 0, trimmed: 0 };
      const copied: { tenant: string; agent: string }[] = [];
      /** Scopes with state left out as too large: not copied, but registered (see below). */
      const leftOut: { tenant: string; agent: string }[] = [];
      // As the broker counts a record against the topic's max.message.bytes (batch framing, key, value): key and
      // value alone let a record within about 80 bytes of the limit through, the broker refused it, and the
      // whole copy failed at every interval.
      const fits = (key: string, value: string | null) => {
        const bytes = messageBytes({ key, value });
        return bytes <= this.s.maxRecordBytes ? null : bytes;
      };
      // A context's key alone can be over the limit (long ids and context names): its tombstone is then left out
      // too, as the broker would refuse it with the whole copy. Under the same limit no record of that key was
      // ever copied, so there is nothing on the topic for it to delete.
      const tombstone = (key: string): boolean => {
        if (fits(key, null) !== null) return false;
        records.push({ key, value: null });
        return true;
      };
      for (const c of copies) {
        // No state: lost with Redis (the restore brings it back from the topic), retired, or never written.
        // Nothing to copy, and above all no tombstones.
        const meta = c.meta === null ? null : metaCopy(c.meta);
        if (meta === null) continue;
        const scopeKey = scopeRecordKey(prefix, c.tenant, c.agent);
        const id = scopeId(c.tenant, c.agent);
        const at = Date.now();
        let scopeValue = scopeRecordValue(meta.clock, meta.fam, at, c.forgets);
        let over = fits(scopeKey, scopeValue);
        if (over === null) this.fitted('trimmed', id);
        if (over !== null && meta.fam) {
          // The families' evidence is what grows (up to maxFamilies): without it the scope still restores, with its
          // clock and rules, and learns its families again (as from a copy of an older version). A tombstone
          // would retire the scope, and a refused record would fail every copy of its round, every interval.
          scopeValue = scopeRecordValue(meta.clock, undefined, at, c.forgets);
          if (fits(scopeKey, scopeValue) === null) {
            kinds.trimmed++;
            if (this.firstWarning('trimmed', id))
              this.s.log.warn(
                { bytes: over, limit: this.s.maxRecordBytes },
                "a scope record is over PAVER_MAX_OUTPUT_BYTES: copied without its families' evidence (warned once per scope)",
              );
            over = null;
          }
        }
        if (over !== null) {
          // Not even its clock fits (ids near the limit): the scope is left out of this copy, its marks with it,
          // so that it does not hold back the other scopes of its round. The topic keeps what it had of it.
          kinds.too_large++;
          if (this.firstWarning('left_out', id))
            this.s.log.warn(
              { bytes: over, limit: this.s.maxRecordBytes },
              'a scope record is over PAVER_MAX_OUTPUT_BYTES: the scope is left out of the rules topic (warned once per scope)',
            );
          // Registered all the same: the topic may hold its older records (copied while they fitted, the registry
          // absent or off), which only the sweep retires. Left out of the registry, it was never swept.
          leftOut.push(c);
          continue;
        }
        this.fitted('left_out', id);
        copied.push(c);
        records.push({ key: scopeKey, value: scopeValue });
        for (const [ctx, stored] of c.ctxs) {
          const key = contextRecordKey(prefix, c.tenant, c.agent, ctx);
          if (stored === null) {
            if (tombstone(key)) kinds.tombstone++;
            else kinds.too_large++;
            continue;
          }
          // The generation read with the scope: a restore leaves out a context copied before the latest forget.
          const value = contextRecordValue(stored, c.forgets);
          const bytes = fits(key, value);
          if (bytes !== null) {
            // A tombstone in its place: a restore must not bring back an older, smaller copy of it.
            tombstone(key);
            kinds.too_large++;
            this.s.log.warn(
              { bytes, limit: this.s.maxRecordBytes },
              'a learned context is over PAVER_MAX_OUTPUT_BYTES: left out of the rules topic',
            );
            continue;
          }
          records.push({ key, value });
          kinds.context++;
        }
      }
      // Both settle before the leases go: a registration that failed must not let the sweep retire the scope
      // while this send is still in flight (its records would land after the tombstones).
      const sent = await Promise.allSettled([
        this.s.sink.sendRaw(this.s.topic, records),
        this.s.register?.([...copied, ...leftOut]),
      ]);
      for (const r of sent) if (r.status === 'rejected') throw r.reason;
      // A send that outlasted the leases may have landed after a newer copy another instance made meanwhile:
      // the round is then copied again (the failure keeps its marks), so the last copy is a current one.
      try {
        // Whatever their age: one round trip per round of copies, off the batch path.
        await leases.keepFresh(true);
      } catch (err) {
        const copiedIds = new Set(copied.map((c) => scopeId(c.tenant, c.agent)));
        const stale = scopes.filter((w) => copiedIds.has(scopeId(w.tenant, w.agent)));
        try {
          await this.s.requeue?.(stale);
        } catch (fence) {
          this.leftUnfenced(owedFence(fence, stale));
          // The lease lost is why the copy failed, and what the failed flush logs: a fence that failed too, thrown
          // in its place, hid it. Logged here beside it.
          this.s.log.warn(
            { err: errorMessage(fenceCause(fence)), copy: errorMessage(err) },
            "a stale copy's scopes not fenced (their records may outlive a retirement or a forget); trying at the next copy",
          );
        }
        throw err;
      }
      for (const [kind, n] of Object.entries(kinds)) if (n > 0) this.s.metrics.records.inc({ kind }, n);
    } finally {
      await leases.release();
    }
  }
}

/** The scopes a failed fence still owes: those it names, or all it was given for a failure of another kind. */
function owedFence(err: unknown, given: ContextsWritten[]): readonly ContextsWritten[] {
  return err instanceof StaleFenceFailed ? err.scopes : given;
}

/** What made a fence fail (the first failed round's cause, for `StaleFenceFailed`): the reason worth logging. */
function fenceCause(err: unknown): unknown {
  return err instanceof StaleFenceFailed ? err.cause : err;
}

/**
 * Copies the rules topic back into Redis: every scope of this key prefix that has no state in Redis gets the
 * topic's copy (a scope with state is newer, and is left as it is). Idempotent: run again, it writes nothing.
 * Once `goOn` is false (the service stopping) it gives up, between fetches or between scopes, leaving its flag.
 *
 * With an idle TTL (`scopeTtlMs` > 0), a scope keeps what was left of its lifetime when its latest copy was
 * taken: one idle for longer (its rules had expired, or would have) is not brought back (`expired`). A copy of
 * an older version carries no time and gets the whole TTL. With `retire` (the sweep of idle scopes), the
 * scopes written are registered for it, their hashes get its grace past the TTL, and the records of the scopes
 * left out are queued for the sweep to tombstone (`ScopeRetirement.queueRetiring`). A scope
 * whose scope record is a tombstone or missing (retired) is left out as expired too, whatever its contexts'
 * records and whatever `scopeTtlMs` is (0 included: a TTL turned off after a retirement does not revive the
 * scope; without the sweep its leftover records then stay on the topic, left out by every restore). So is a
 * scope whose latest copy was read before its latest forget (`restoreVerdict`), at any TTL. A scope written
 * back gets only its contexts copied after its latest forget: the others are records a copy read before the
 * forget left on the topic (landed after its tombstones, never fenced), and with `retire` they are queued for
 * the sweep's tombstones once the scope is written (it spares what the scope holds).
 *
 * First of all, each scope's forget generation goes back to Redis (`raiseForgets`), before any batch, copy or
 * forget can read it: a forget after the loss then writes a marker above every copy read before it, those of
 * the Redis that was lost included. `forgotten` counts the scopes left out because of their marker by the restore
 * that wrote their generation back first (another instance restoring after the same loss does not count them).
 */
export function restoreRules(
  redis: Redis,
  prefix: string,
  flag: string,
  replay: ReplayOptions,
  goOn: () => boolean = () => true,
  scopeTtlMs = 0,
  now: () => number = Date.now,
  retire?: { graceMs: number; retirement: ScopeRetirement },
): Promise<{
  scopes: number;
  restored: number;
  contexts: number;
  skipped: number;
  expired: number;
  forgotten: number;
  /** Context records left out of scopes written back, as copied before their scope's latest forget. */
  stale: number;
}> {
  return flaggedRestore(redis, flag, async () => {
    const { scopes, skipped, generations } = await readRulesLog(replay, prefix, goOn);
    // Every scope's generation as Redis holds it too (a generation of 0 only reads it): one the topic's marker
    // does not show (not sent, or a lower marker from a stalled earlier forget landed last) still counts.
    const listed = new Set(generations.map((g) => scopeId(g.tenant, g.agent)));
    const { raised, held } = await raiseForgets(redis, prefix, [
      ...generations,
      ...scopes
        .filter((s) => !listed.has(scopeId(s.tenant, s.agent)))
        .map((s) => ({ tenant: s.tenant, agent: s.agent, forgets: 0 })),
    ]);
    let restored = 0;
    let contexts = 0;
    let forgotten = 0;
    const expired: ScopeCopyRead[] = [];
    const leftOutForgotten: ScopeCopyRead[] = [];
    const written: ScopeCopyRead[] = [];
    /** Contexts of scopes written back that a copy read before their latest forget left on the topic. */
    const stale: { tenant: string; agent: string; ctxs: string[] }[] = [];
    const register = async () => {
      await retire?.retirement.register(written.splice(0));
    };
    for (const s of scopes) {
      if (!goOn()) throw new RebuildStopped();
      const v = restoreVerdict(s, scopeTtlMs, now(), held.get(scopeId(s.tenant, s.agent)));
      if (!v.restore) {
        if (v.why !== 'forgotten') expired.push(s);
        else {
          leftOutForgotten.push(s);
          if (raised.has(scopeId(s.tenant, s.agent))) forgotten++;
        }
        continue;
      }
      const grace = scopeTtlMs > 0 ? (retire?.graceMs ?? 0) : 0;
      const r = await restoreScope(
        redis,
        prefix,
        s.tenant,
        s.agent,
        s.clock,
        v.ctxs,
        s.fam,
        v.leftMs + grace,
      );
      if (!r.written) continue;
      // Only by the restore that wrote the scope: queued before, its retiring set would keep it from being written.
      if (v.stale.length > 0) stale.push({ tenant: s.tenant, agent: s.agent, ctxs: v.stale });
      written.push(s);
      if (written.length >= 32) await register();
      restored++;
      contexts += r.contexts;
    }
    await register();
    // Before the flag goes: a stop or a failure here leaves the restore to run again, not the records for ever.
    const queued = await retire?.retirement.queueRetiring(
      expired.map((s) => ({ tenant: s.tenant, agent: s.agent, ctxs: s.ctxs.keys() })),
      { goOn, outcome: 'expired_at_restore' },
    );
    if (queued === false) throw new RebuildStopped();
    // Their leftovers go as any retired scope's (counted above, not as expired).
    const queuedForgotten = await retire?.retirement.queueRetiring(
      leftOutForgotten.map((s) => ({ tenant: s.tenant, agent: s.agent, ctxs: s.ctxs.keys() })),
      { goOn },
    );
    if (queuedForgotten === false) throw new RebuildStopped();
    // Live scopes: the sweep tombstones these names, not the scope record, and spares any the scope holds again.
    const queuedStale = await retire?.retirement.queueRetiring(stale, { goOn });
    if (queuedStale === false) throw new RebuildStopped();
    return {
      scopes: scopes.length,
      restored,
      contexts,
      skipped,
      expired: expired.length,
      forgotten,
      stale: stale.reduce((n, s) => n + s.ctxs.length, 0),
    };
  });
}
