import type { Redis } from 'ioredis';
import { z } from 'zod';
import { classifyError, errorMessage, PaverError } from '../../../../shared/errors.js';
import { messageBytes } from '../../../../shared/kafka/dead-letter.js';
import { jsonOf } from '../../../../shared/kafka/replay.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Logger } from '../../../../shared/log.js';
import { execPipeline } from '../../../../shared/redis/replies.js';
import { invokeScript, parseScriptReply } from '../../../../shared/redis/scripts.js';
import { scopeId } from '../core/learn/engine.js';
import { contextRecordKey, forgetMarkerKey, forgetMarkerValue, scopeRecordKey } from './kafka/rules-log.js';
import {
  fenceKey,
  forgetsKey,
  generationOf,
  learnKey,
  retiringKey,
  type ContextsWritten,
} from './redis/learn-store.js';

export { fenceKey, retiringKey };
import { defineScopeScripts, ScopeLeases, type ScopeRef } from './redis/scope-lease.js';

/**
 * Retiring idle scopes from the rules topic. Redis forgets a scope idle for AUTOSEQ_LEARN_SCOPE_TTL_MS by
 * itself (its rules hash expires), but compaction keeps the scope's records in the rules topic for ever: where
 * scope ids come and go (a run id in `agent_id`), the topic grew without bound and every restore read all of
 * it. So, while the topic copy is on, the hash is given a grace beyond the TTL, and a sweep retires a scope
 * once it has been idle for the TTL, in two steps under the scope's lease:
 *
 * 1. `retireScope-3.lua` (fenced by the lease, as a batch's write is) moves the names of the scope's contexts
 *    to its `retiring` set and deletes its state. A batch of the scope now starts afresh, and a copy finds
 *    nothing to copy.
 * 2. Tombstones for those contexts and for the scope record (minus any context a scope that came back holds
 *    again), then the set is deleted and the scope leaves the registry.
 *
 * An instance that dies between the two leaves the set: the next sweep finishes the retirement. The sweep
 * finds scopes in a registry (a set of `[tenant, agent]`) that the copy writes: a scope with nothing in the
 * topic has nothing to retire, and Redis's expiry alone takes it.
 */

/** `<prefix>:aseq:scopes`: the scopes whose records the rules topic may hold. */
export const scopeRegistryKey = (prefix: string): string => `${prefix}:aseq:scopes`;
/** `<prefix>:aseq:sweep-turn`: which instance sweeps this period (SET NX, expiring after one period). */
export const sweepTurnKey = (prefix: string): string => `${prefix}:aseq:sweep-turn`;
const member = (s: { tenant: string; agent: string }) => JSON.stringify([s.tenant, s.agent]);
const memberShape = z.tuple([z.string().min(1), z.string().min(1)]);

/** Scopes retired per round trip (and per set of leases held; up to 2,000 tombstones each). */
const SCOPES_PER_ROUND = 8;
/** Registry members read per SSCAN page. */
const SCAN_COUNT = 500;
/** The longest a retiring set is kept (it is deleted once its tombstones are out, normally within the sweep). */
const RETIRING_KEEP_MS = 7 * 24 * 3_600_000;

/**
 * How often the sweep runs, and the grace the hash keeps past the TTL: a tenth of the TTL (between a second
 * and ten minutes), and three sweeps. A sweep that misses a scope (its lease taken, Redis unreachable) has two
 * more before Redis's own expiry takes the hash and, with it, what the sweep needed to know: which contexts
 * the topic holds.
 */
export function retireTiming(ttlMs: number): { sweepMs: number; graceMs: number } {
  const sweepMs = Math.min(600_000, Math.max(1_000, Math.floor(ttlMs / 10)));
  return { sweepMs, graceMs: 3 * sweepMs };
}

export type RetireOutcome = 'retired' | 'gone' | 'stale_copy' | 'expired_at_restore';

export interface ScopeRetirementSpec {
  redis: Redis;
  prefix: string;
  sink: Sink;
  /** AUTOSEQ_RULES_TOPIC. */
  topic: string;
  leaseMs: number;
  /** The hash's grace past the TTL (`retireTiming`): a scope whose hash has this little left is retired. */
  graceMs: number;
  log: Logger;
  /** While true (a restore runs), no sweep. */
  paused: () => boolean;
  /**
   * The guard's `ensure()`, awaited before each sweep: the epoch checked (and a loss restored) now, not only at
   * the next batch. Scopes are idle when no batch comes, and a marker that changed meanwhile (evicted, or Redis
   * lost) kept the guard's epoch stale for as long: every retirement's tombstones then waited for a marker the
   * guard had not seen, its first step already done (state deleted, records still on the topic), for good.
   */
  ensureState?: () => Promise<void>;
  /**
   * The epoch marker (`key`), the value this instance's guard last saw (`value`), and the restore flag (`flag`).
   * A scope found without state is taken for one Redis forgot (its expiry, an operator) only while the marker
   * is the one the guard saw and no restore is under way: then, and only then, no restore can bring it back
   * from the copy, and its scope record is tombstoned. A scope lost with Redis and not restored yet looks the
   * same, and its copy must stay.
   */
  epoch: { key: string; flag: string; value: () => string | null };
  /**
   * False when no sweep runs (`AUTOSEQ_LEARN_SCOPE_TTL_MS=0`): a stale copy's fence (`afterStaleCopy`) whose send
   * fails is then left to the marks alone, as nothing would retry it through the registry.
   */
  sweeps?: boolean;
  /** False when the rules are not copied to the topic (`AUTOSEQ_RULES_SNAPSHOT_MS=0`): `forget` sends nothing. */
  copies?: boolean;
  /**
   * PAVER_MAX_OUTPUT_BYTES, as the copy holds its records to it (`messageBytes`): a tombstone over it is left out,
   * as the copy leaves it out. No record of that key fitted under it, and the broker would refuse the tombstone
   * with the whole round, at every sweep (a scope left out of the copy as too large is registered too).
   */
  maxRecordBytes?: number;
  onRetired: (outcome: RetireOutcome, scopes: number) => void;
  /**
   * Forget markers sent (`forget_marker`), or left out as over `maxRecordBytes` (`too_large`): the copy's records
   * counter (`paver_autoseq_rules_snapshot_records_total{kind}`).
   */
  onRecords?: (kind: 'forget_marker' | 'too_large', records: number) => void;
  /**
   * Tombstones whose send may have outlasted the leases: a scope that came back meanwhile may have copied some
   * of those contexts first. They are copied again (a copy skips a scope with no state, and sends a tombstone
   * for a context the state does not hold), so the topic ends as the state is.
   */
  recopy: (written: ContextsWritten[]) => void;
}

/**
 * `forgets`: the scope's forget generation (0: never forgotten), whose marker goes with the tombstones. `fenced`: a
 * stale copy's fence left it to the sweep (its `fence` set held names).
 */
/**
 * `afterStaleCopy` failed for some of its scopes: `scopes`, those still owed a fence (each found without state whose
 * send failed, or the whole of a round that failed before its state check), and `cause`, the first failure.
 */
export class StaleFenceFailed extends Error {
  constructor(
    readonly scopes: ContextsWritten[],
    override readonly cause: unknown,
  ) {
    super(`stale copy not fenced for ${scopes.length} scope(s): ${errorMessage(cause)}`);
    this.name = 'StaleFenceFailed';
  }
}

type Retiring = ScopeRef & { ctxs: string[]; live: boolean; forgets: number; fenced?: boolean };

export class ScopeRetirement {
  private timer: NodeJS.Timeout | null = null;
  /** The sweep under way. */
  private work: Promise<unknown> = Promise.resolve();
  private stopped = false;

  constructor(private readonly s: ScopeRetirementSpec) {
    defineScopeScripts(s.redis);
  }

  /** Adds scopes to the registry (the copy, under their leases; the restore, for the scopes it wrote). */
  async register(scopes: readonly { tenant: string; agent: string }[]): Promise<void> {
    if (scopes.length === 0) return;
    await this.s.redis.sadd(scopeRegistryKey(this.s.prefix), ...scopes.map(member));
  }

  /**
   * Whether this instance sweeps this period: the first to ask in a period does. Every instance runs the timer,
   * but each sweep reads the whole registry, so with one per instance a deployment of n instances read it n
   * times a period for nothing (one sweep retires every scope due). An instance that dies holding the turn
   * loses it with the period; the next period's sweep finishes what it left (its rounds hold leases).
   */
  async takeTurn(periodMs: number): Promise<boolean> {
    // A little under the period: the holder's own next tick, a period later, finds the turn free again.
    const ttl = Math.max(1, periodMs - Math.min(1_000, Math.floor(periodMs / 10)));
    return (await this.s.redis.set(sweepTurnKey(this.s.prefix), this.turnToken, 'PX', ttl, 'NX')) === 'OK';
  }

  private readonly turnToken = `${process.pid}:${Math.random().toString(36).slice(2)}`;

  start(intervalMs: number): void {
    const tick = () => {
      this.timer = setTimeout(() => {
        void this.run(async () => {
          if (await this.takeTurn(intervalMs)) await this.sweep();
        }).finally(() => {
          if (!this.stopped) tick();
        });
      }, intervalMs);
      this.timer.unref();
    };
    tick();
  }

  /** Runs `job` after the work under way, one at a time; a failure is logged (the next sweep tries again). */
  private run(job: () => Promise<unknown>): Promise<unknown> {
    this.work = this.work.then(job).catch((err: unknown) => {
      // A sweep that found Redis lost waits in `ensureState` for the restore, which a stop gives up
      // (`RebuildStopped`): the stop's doing, owed to the next start, and no failure to warn about at every stop.
      if (classifyError(err).code === 'SHUTTING_DOWN')
        this.s.log.info('idle scope sweep: restore stopped by the shutdown; done again at the next start');
      else
        this.s.log.warn(
          { err: errorMessage(err) },
          'idle scope retirement failed; the next sweep tries again',
        );
    });
    return this.work;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.work;
  }

  /**
   * One pass over the registry: every scope idle for the TTL is retired, every unfinished retirement finished,
   * and a scope found without state dropped. A round that fails is logged and the pass goes on.
   */
  async sweep(): Promise<{ retired: number; gone: number; failed: number }> {
    const { redis, prefix } = this.s;
    const total = { retired: 0, gone: 0, failed: 0 };
    if (this.s.paused()) return total;
    await this.s.ensureState?.();
    if (this.stopped) return total;
    let cursor = '0';
    do {
      const [next, members] = await redis.sscan(scopeRegistryKey(prefix), cursor, 'COUNT', SCAN_COUNT);
      cursor = next;
      const refs: ScopeRef[] = [];
      for (const m of members) {
        const r = memberShape.safeParse(jsonOf(m));
        if (r.success) refs.push({ id: scopeId(r.data[0], r.data[1]), tenant: r.data[0], agent: r.data[1] });
      }
      if (refs.length === 0) continue;
      const pipe = redis.pipeline();
      for (const r of refs) {
        pipe.pttl(learnKey(prefix, r.tenant, r.agent));
        pipe.exists(retiringKey(prefix, r.tenant, r.agent));
      }
      const reads = await execPipeline(pipe, 'idle scope sweep');
      const due = refs.filter((_, i) => this.due(reads[2 * i] as number, reads[2 * i + 1] === 1));
      for (let i = 0; i < due.length && !this.stopped && !this.s.paused(); i += SCOPES_PER_ROUND) {
        try {
          const r = await this.retireRound(due.slice(i, i + SCOPES_PER_ROUND));
          total.retired += r.retired;
          total.gone += r.gone;
        } catch (err) {
          total.failed++;
          this.s.log.warn(
            { err: errorMessage(err), scopes: Math.min(SCOPES_PER_ROUND, due.length - i) },
            'idle scopes not retired; the next sweep tries again',
          );
        }
      }
    } while (cursor !== '0' && !this.stopped && !this.s.paused());
    return total;
  }

  /**
   * `left`: the hash's PTTL (-2: none, expired or lost with Redis; -1: written without a TTL while expiry was
   * off, left alone until a write gives it one). Idle for the TTL once only the grace is left.
   */
  private due(left: number, retiring: boolean): boolean {
    return retiring || left === -2 || (left >= 0 && left <= this.s.graceMs);
  }

  private async retireRound(refs: ScopeRef[]): Promise<{ retired: number; gone: number }> {
    const { redis, prefix } = this.s;
    const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
    try {
      const pipe = redis.pipeline();
      const took = leases.tryAll(pipe, refs);
      for (const r of refs) {
        pipe.pttl(learnKey(prefix, r.tenant, r.agent));
        pipe.exists(retiringKey(prefix, r.tenant, r.agent));
      }
      // After the reads: a loss before them takes the marker too (or a guard has put another in its place).
      pipe.get(this.s.epoch.key);
      pipe.exists(this.s.epoch.flag);
      const replies = await execPipeline(pipe, 'idle scope read');
      took(replies.slice(0, refs.length));
      // A scope whose lease another holds is being learned in or copied: not idle, whatever its TTL said.
      const held = new Set(leases.holding().map((s) => s.id));
      const reads = replies.slice(refs.length, 3 * refs.length);
      const forgotten = this.forgottenByRedis(replies[3 * refs.length], replies[3 * refs.length + 1]);
      const idle: ScopeRef[] = [];
      const unfinished: ScopeRef[] = [];
      const gone: ScopeRef[] = [];
      refs.forEach((r, i) => {
        if (!held.has(r.id)) return;
        const left = reads[2 * i] as number;
        const retiring = reads[2 * i + 1] === 1;
        if (retiring) unfinished.push(r);
        // Idle again while a retirement is unfinished (it came back, then went idle): step 1 adds its names.
        if (left >= 0 && left <= this.s.graceMs) idle.push(r);
        // Without state: Redis's expiry took it (or an operator deleted it), unless Redis lost it, which only
        // the marker tells; then it stays in the registry for a later sweep, its records for the restore.
        else if (left === -2 && !retiring && forgotten) gone.push(r);
      });

      // Step 1, fenced: state out, names kept.
      let retired: ScopeRef[] = [];
      if (idle.length > 0) {
        const step = redis.pipeline();
        for (const s of idle)
          invokeScript(
            step,
            'retireScope',
            [leases.leaseKey(s), learnKey(prefix, s.tenant, s.agent), retiringKey(prefix, s.tenant, s.agent)],
            [leases.token, RETIRING_KEEP_MS],
          );
        const r = await execPipeline(step, 'idle scope retire');
        retired = idle.filter((_, i) => r[i] === 1);
        // Expired since the read, under the lease the script found still held: no loss came in between (a loss
        // takes the lease with it, and the script then refuses).
        gone.push(...idle.filter((_, i) => r[i] === 0));
      }

      // Step 2: tombstones, then the names go and the scope leaves the registry. A gone scope's scope record is
      // tombstoned too (its context names went with its hash): a restore then takes it as retired whatever the
      // TTL is by then, where before it came back at TTL 0 (no copy age to judge it by).
      const finishing = [...unfinished, ...retired.filter((s) => !unfinished.includes(s))];
      const goneOnly = gone.filter((g) => !finishing.includes(g));
      const done =
        finishing.length + goneOnly.length > 0 ? await this.finish(leases, [...finishing, ...goneOnly]) : [];
      // Redis lost (or being restored) before `finish` read the names: nothing was sent, and every scope stays
      // in the registry, its retirement for a sweep after the restore.
      if (done === null) return { retired: 0, gone: 0 };
      // A scope that came back before its retirement was finished stays, with its own records.
      const ended = done.filter((s) => !s.live && finishing.some((f) => f.id === s.id));
      const removed = await this.unregister([...gone, ...ended]);
      // Counted once the tombstones are out, by whichever sweep finished the retirement; `gone` only by the
      // sweep that took the scope out (another instance's sweep may have seen it before it was retired). A scope
      // a failed fence left here was retired or forgotten before (counted then): its stale copy's records went
      // now, and Redis's expiry had no part in it. Before, it was counted `gone`.
      const fenced = new Set(done.filter((s) => s.fenced).map((s) => s.id));
      const wentAway = gone.filter((s) => removed.has(s.id) && !fenced.has(s.id)).length;
      const staleCopies = gone.filter((s) => removed.has(s.id) && fenced.has(s.id)).length;
      if (ended.length > 0) this.s.onRetired('retired', ended.length);
      if (wentAway > 0) this.s.onRetired('gone', wentAway);
      if (staleCopies > 0) this.s.onRetired('stale_copy', staleCopies);
      return { retired: ended.length, gone: wentAway };
    } finally {
      await leases.release();
    }
  }

  /**
   * Whether a scope this instance finds without state was forgotten by Redis itself (expiry, a deletion), not
   * lost with it: the marker (read after the scope) is the one this instance's guard saw, and no restore runs.
   */
  private forgottenByRedis(marker: unknown, restoring: unknown): boolean {
    const seen = this.s.epoch.value();
    return seen !== null && marker === seen && restoring === 0;
  }

  /**
   * Tombstones over PAVER_MAX_OUTPUT_BYTES, left out of a send (the broker would refuse it whole, at every sweep)
   * and so never sent: the retirement finishes without them. Their records stay on the topic where a record of the
   * key fitted once (the limit lowered since); a restore leaves them out with their tombstoned scope record.
   * Counted `too_large` and warned, without keys, once the send that left them out is done: the retirement then
   * ends, so they are not counted or warned about again.
   */
  private tombstonesLeftOut(n: number): void {
    if (n === 0) return;
    this.s.onRecords?.('too_large', n);
    this.s.log.warn(
      { tombstones: n, limit: this.s.maxRecordBytes },
      'tombstones over PAVER_MAX_OUTPUT_BYTES left out of a retirement: their records, if any, stay on the rules topic',
    );
  }

  /**
   * Tombstones for the names in each scope's retiring set; returns the scopes whose set was then deleted, or null
   * when Redis lost its state or a restore is under way (nothing sent). Read after the names and the hashes, the
   * marker tells whether those reads saw Redis as the guard did: a scope lost with Redis reads as one without
   * state, so its scope record would be tombstoned, and with it every copy a restore could bring back. A
   * retiring set found on a lost Redis is no retirement of the scope's records either (the restore has not
   * written them back yet). Before, an unfinished retirement was tombstoned whatever the marker said.
   */
  private async finish(leases: ScopeLeases, scopes: ScopeRef[]): Promise<Retiring[] | null> {
    const { redis, prefix } = this.s;
    const pipe = redis.pipeline();
    for (const s of scopes) {
      pipe.smembers(retiringKey(prefix, s.tenant, s.agent));
      pipe.hkeys(learnKey(prefix, s.tenant, s.agent));
      pipe.get(forgetsKey(prefix, s.tenant, s.agent));
      pipe.smembers(fenceKey(prefix, s.tenant, s.agent));
    }
    pipe.get(this.s.epoch.key);
    pipe.exists(this.s.epoch.flag);
    const reads = await execPipeline(pipe, 'retiring scope read');
    if (!this.forgottenByRedis(reads[4 * scopes.length], reads[4 * scopes.length + 1])) return null;
    // A scope that came back after step 1 holds some contexts again: their records are its own now.
    const todo: Retiring[] = scopes.map((s, i) => {
      const fence = reads[4 * i + 3] as string[];
      const names = new Set([...(reads[4 * i] as string[]), ...fence]);
      const fields = new Set(reads[4 * i + 1] as string[]);
      return {
        ...s,
        live: fields.has('m'),
        ctxs: [...names].filter((c) => c !== '' && !fields.has(`c:${c}`)),
        // A scope once forgotten has its marker sent again (the same key and generation): a forget whose
        // instance died after its first step is finished by the sweep, marker included.
        forgets: generationOf(reads[4 * i + 2]),
        fenced: fence.length > 0,
      };
    });
    const { records, markers, tooLarge, tombstonesLeftOut } = retirementRecords(
      prefix,
      todo,
      this.s.maxRecordBytes,
    );
    if (tooLarge > 0)
      this.s.log.warn(
        { markers: tooLarge, limit: this.s.maxRecordBytes },
        "a forget marker is over PAVER_MAX_OUTPUT_BYTES: left out (the scope's tombstones alone keep it out)",
      );
    try {
      await this.s.sink.sendRaw(this.s.topic, records);
      // A send that outlasted the leases: a scope that came back may have copied some of these first.
      await leases.keepFresh(true);
    } catch (err) {
      this.s.recopy(todo.map((s) => ({ tenant: s.tenant, agent: s.agent, ctxs: s.ctxs })));
      throw err;
    }
    if (markers > 0) this.s.onRecords?.('forget_marker', markers);
    if (tooLarge > 0) this.s.onRecords?.('too_large', tooLarge);
    this.tombstonesLeftOut(tombstonesLeftOut);
    const del = redis.pipeline();
    for (const s of todo)
      del.del(retiringKey(prefix, s.tenant, s.agent), fenceKey(prefix, s.tenant, s.agent));
    await execPipeline(del, 'retiring scope delete');
    return todo;
  }

  /**
   * Takes scopes out of the registry, under their leases; returns those this call removed. The leases may have
   * run out by now (a stall), and a scope that came back, or that a restore queued for retirement, may have
   * been registered again meanwhile: one found with state or a retirement under way afterwards is put back, so
   * that neither a live scope with records on the topic nor a retirement to finish is ever left out.
   */
  private async unregister(scopes: ScopeRef[]): Promise<Set<string>> {
    if (scopes.length === 0) return new Set();
    const { redis, prefix } = this.s;
    // One SREM per scope: its reply says whether this call took it out.
    const removed = await Promise.all(scopes.map((s) => redis.srem(scopeRegistryKey(prefix), member(s))));
    const check = redis.pipeline();
    for (const s of scopes) {
      check.exists(learnKey(prefix, s.tenant, s.agent));
      check.exists(retiringKey(prefix, s.tenant, s.agent));
    }
    const exists = await execPipeline(check, 'retired scope check');
    await this.register(scopes.filter((_, i) => exists[2 * i] === 1 || exists[2 * i + 1] === 1));
    return new Set(scopes.filter((_, i) => removed[i] === 1).map((s) => s.id));
  }

  /**
   * Forgets one scope now, whatever its TTL (an operator's `POST /rules/forget`): the two steps of a retirement
   * under its lease, waiting for a batch or a copy that holds it. Its state is deleted (a batch of the scope then
   * starts afresh) and its records on the rules topic are tombstoned, the scope record included, so that no
   * restore brings it back; deleting the hash alone left the topic's copy, which the next restore after a Redis
   * loss wrote back. A scope with no state still gets its scope record tombstoned, if Redis did not lose it
   * (the marker the guard saw, no restore under way: else `STATE_CONTENDED`, retriable, and nothing is done).
   * A loss or a stall past the lease during the tombstones' send fails it too, and the contexts are copied
   * again from what Redis holds then: run it again. Returns whether the scope had state, and how many context
   * records were tombstoned.
   *
   * With the tombstones goes the scope's forget marker: its forget generation, raised by one in the fenced first
   * step (`forgetScope-4.lua`). Every copy carries the generation it read with the scope, under the lease, so a
   * copy read before this forget carries a lower one than the marker, however late it lands (a send stalled
   * past its lease), and a restore leaves it out (`restoreVerdict`) whether or not anything fenced it since and
   * whatever Redis lost meanwhile.
   */
  async forget(tenant: string, agent: string): Promise<{ state: boolean; contexts: number }> {
    const { redis, prefix } = this.s;
    const ref: ScopeRef = { id: scopeId(tenant, agent), tenant, agent };
    const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
    try {
      await leases.acquire([ref]);
      const [marker, restoring] = await execPipeline(
        redis.pipeline().get(this.s.epoch.key).exists(this.s.epoch.flag),
        'forget check',
      );
      if (!this.forgottenByRedis(marker, restoring))
        throw new PaverError(
          'STATE_CONTENDED',
          'Redis lost its state or is being restored: forget again after',
        );
      const keys = [
        leases.leaseKey(ref),
        learnKey(prefix, tenant, agent),
        retiringKey(prefix, tenant, agent),
      ];
      const pipe = redis.pipeline();
      // Without the topic copy there is no marker to write, and no copy to compare a generation with.
      if (this.s.copies === false) invokeScript(pipe, 'retireScope', keys, [leases.token, RETIRING_KEEP_MS]);
      else
        invokeScript(
          pipe,
          'forgetScope',
          [...keys, forgetsKey(prefix, tenant, agent)],
          [leases.token, RETIRING_KEEP_MS],
        );
      const [reply] = await execPipeline(pipe, 'scope forget');
      if (this.s.copies === false) {
        if (reply !== 0 && reply !== 1)
          throw new PaverError('STATE_CONTENDED', 'scope lease lost: forget again');
        await redis.del(retiringKey(prefix, tenant, agent));
        return { state: reply === 1, contexts: 0 };
      }
      const [step] = parseScriptReply('forgetScope', reply, forgetReply, FORGET_LEASE_LOST);
      const finished = await this.finish(leases, [ref]);
      if (finished === null)
        throw new PaverError(
          'STATE_CONTENDED',
          'Redis lost its state or is being restored: forget again after',
        );
      await this.unregister([ref]);
      return { state: step === 1, contexts: finished[0]?.ctxs.length ?? 0 };
    } finally {
      await leases.release();
    }
  }

  /**
   * Queues scopes for the sweep as retirements under way: their context names go to their retiring sets and
   * the scopes to the registry, under the scopes' leases. The sweep then tombstones them as it finishes any
   * retirement: sparing what a scope that is live (or came back) holds, trying again after a failure. For the
   * restore, with the scopes it left out as expired (`outcome: 'expired_at_restore'`), before its flag goes, so
   * that a stop or a failure leaves the restore to run again rather than the records for ever. Only under the
   * restore's flag: a retiring set keeps the restore from writing its scope back, so one queued on a Redis that
   * lost its state (and not restored yet) would retire a scope lost with it (see `afterStaleCopy`).
   * Returns false when `goOn` turned false first.
   */
  async queueRetiring(
    scopes: readonly { tenant: string; agent: string; ctxs: Iterable<string> }[],
    opts: { goOn?: () => boolean; outcome?: RetireOutcome } = {},
  ): Promise<boolean> {
    const list = scopes.map((s) => ({
      id: scopeId(s.tenant, s.agent),
      tenant: s.tenant,
      agent: s.agent,
      ctxs: [...s.ctxs],
    }));
    for (let i = 0; i < list.length; i += SCOPES_PER_ROUND) {
      if (opts.goOn?.() === false) return false;
      await this.queueRound(list.slice(i, i + SCOPES_PER_ROUND), opts.outcome);
    }
    return true;
  }

  /**
   * A copy whose send outlasted its leases (`RuleSnapshots`' `requeue`): its records may have landed after the
   * tombstones of a retirement or of a forget that took the lease meanwhile. Under the scopes' leases, each found
   * without state while Redis has not lost it (the marker the guard saw, no restore under way) has the copy's
   * records tombstoned again now, its scope record included. One with state is the copier's: the failed round is
   * copied again from what it holds (a context it no longer holds as a tombstone). One lost with Redis keeps its
   * records, which the restore needs.
   *
   * At every TTL. Before, with the sweep (TTL > 0) the scopes were queued for it as retirements instead
   * (`queueRetiring`), which went wrong both ways: a copy stalled across a Redis loss queued them on the empty
   * Redis, where the retiring set kept the restore from writing the scope back and the sweep then tombstoned all
   * of it (its rules lost for good); and a forgotten scope whose queue was lost with Redis before the next sweep
   * was restored from the stale copy, until it idled out again.
   */
  async afterStaleCopy(scopes: readonly ContextsWritten[]): Promise<void> {
    const list = scopes.map((s) => ({ id: scopeId(s.tenant, s.agent), ...s }));
    // Every round is tried, and only what is still owed goes back: stopping at the first failure and handing the
    // caller the whole list back made it retry (lease, mark again) scopes already fenced or never due, every copy.
    const owed: ContextsWritten[] = [];
    let failed: { cause: unknown } | null = null;
    for (let i = 0; i < list.length; i += SCOPES_PER_ROUND) {
      const round = list.slice(i, i + SCOPES_PER_ROUND);
      const sending: { todo: ContextsWritten[] | null } = { todo: null };
      try {
        await this.fenceRound(round, sending);
      } catch (err) {
        // Failed before its state check (a lease, Redis): any of the round may be owed.
        const left = sending.todo ?? round;
        owed.push(...left.map((s) => ({ tenant: s.tenant, agent: s.agent, ctxs: s.ctxs })));
        failed ??= { cause: err };
      }
    }
    if (failed) throw new StaleFenceFailed(owed, failed.cause);
  }

  /** `sending.todo`: set once the state is checked, to the scopes found without state (those the send owes). */
  private async fenceRound(
    round: (ScopeRef & { ctxs: string[] })[],
    sending: { todo: ContextsWritten[] | null },
  ): Promise<void> {
    const { redis, prefix } = this.s;
    const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
    try {
      await leases.acquire(round);
      const pipe = redis.pipeline();
      // `m` as the copier reads it: a scope without it has nothing a copy would write.
      for (const s of round) pipe.hexists(learnKey(prefix, s.tenant, s.agent), 'm');
      pipe.get(this.s.epoch.key);
      pipe.exists(this.s.epoch.flag);
      const r = await execPipeline(pipe, 'stale copy check');
      if (!this.forgottenByRedis(r[round.length], r[round.length + 1])) return;
      // No marker: the forget that retired the scope sent it, and a stale copy never removes it.
      const todo: Retiring[] = round
        .filter((_, i) => r[i] === 0)
        .map((s) => ({ ...s, live: false, forgets: 0 }));
      sending.todo = todo;
      if (todo.length === 0) return;
      try {
        const { records, tombstonesLeftOut } = retirementRecords(prefix, todo, this.s.maxRecordBytes);
        await this.s.sink.sendRaw(this.s.topic, records);
        this.tombstonesLeftOut(tombstonesLeftOut);
        // As in `finish`: a scope that came back during a send past the lease may have copied some of these first.
        await leases.keepFresh(true);
        if (this.s.sweeps !== false) {
          // Its records are all tombstones now: nothing left for the sweep, which would take a scope still
          // registered (the stale copy registers what it copies) for one Redis's expiry took, and count it `gone`.
          const del = redis.pipeline();
          for (const s of todo) del.del(fenceKey(prefix, s.tenant, s.agent));
          await execPipeline(del, 'stale copy fenced');
          await this.unregister(todo);
        }
      } catch (err) {
        this.s.recopy(todo.map((s) => ({ tenant: s.tenant, agent: s.agent, ctxs: s.ctxs })));
        // The copier skips a scope without state, so the marks alone never try again. With the sweep, the
        // registry does: it tombstones the scope record of a scope it finds without state while Redis has not
        // lost it (a restore then leaves the scope out), and the copy's contexts named in its `fence` set. Safe
        // on a lost Redis, unlike a retiring set: the restore reads neither.
        if (this.s.sweeps !== false)
          await this.leaveToSweep(todo).catch((e: unknown) =>
            this.s.log.warn({ err: errorMessage(e) }, 'stale copy not registered for the sweep'),
          );
        throw err;
      }
    } finally {
      await leases.release();
    }
  }

  /** Under the scopes' leases (the fence's): the copy's names in each scope's `fence` set, and the scope registered. */
  private async leaveToSweep(scopes: readonly (ScopeRef & { ctxs: string[] })[]): Promise<void> {
    const { redis, prefix } = this.s;
    const pipe = redis.pipeline();
    for (const s of scopes) {
      const key = fenceKey(prefix, s.tenant, s.agent);
      // '' as in a retiring set: a copy of the scope record alone still marks the scope as fenced.
      pipe.sadd(key, '');
      for (let j = 0; j < s.ctxs.length; j += 1000) pipe.sadd(key, ...s.ctxs.slice(j, j + 1000));
      pipe.pexpire(key, RETIRING_KEEP_MS);
    }
    await execPipeline(pipe, 'stale copy fence');
    await this.register(scopes);
  }

  private async queueRound(round: (ScopeRef & { ctxs: string[] })[], outcome?: RetireOutcome): Promise<void> {
    const { redis, prefix } = this.s;
    // Under the leases: a sweep finishing one of these reads and deletes its names as one.
    const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
    try {
      await leases.acquire(round);
      const pipe = redis.pipeline();
      for (const s of round) {
        const key = retiringKey(prefix, s.tenant, s.agent);
        pipe.exists(learnKey(prefix, s.tenant, s.agent));
        pipe.sadd(key, '');
        for (let j = 0; j < s.ctxs.length; j += 1000) pipe.sadd(key, ...s.ctxs.slice(j, j + 1000));
        pipe.pexpire(key, RETIRING_KEEP_MS);
      }
      const replies = await execPipeline(pipe, 'expired scope queue');
      await this.register(round);
      // Counted by the first instance (or sweep) to queue a scope with no state: one that came back is queued
      // too (its leftovers go, what it holds again stays), but it is not expired.
      let at = 0;
      let queued = 0;
      for (const s of round) {
        if (replies[at] === 0 && replies[at + 1] === 1) queued++;
        at += 3 + Math.ceil(s.ctxs.length / 1000);
      }
      if (outcome && queued > 0) this.s.onRetired(outcome, queued);
    } finally {
      await leases.release();
    }
  }
}

/**
 * Scopes' records as tombstones (their contexts, then the scope record of each that has no state), and the forget
 * marker of each once forgotten. Records over `maxBytes` are left out: the broker would refuse them with the whole
 * send, and no record of a tombstone's key fitted under the same limit (a marker left out is counted).
 */
function retirementRecords(
  prefix: string,
  scopes: readonly Retiring[],
  maxBytes = Infinity,
): {
  records: { key: string; value: string | null }[];
  markers: number;
  tooLarge: number;
  tombstonesLeftOut: number;
} {
  const records: { key: string; value: string | null }[] = [];
  let markers = 0;
  let tooLarge = 0;
  const at = Date.now();
  for (const s of scopes) {
    for (const c of s.ctxs)
      records.push({ key: contextRecordKey(prefix, s.tenant, s.agent, c), value: null });
    if (!s.live) records.push({ key: scopeRecordKey(prefix, s.tenant, s.agent), value: null });
    if (s.forgets === 0) continue;
    const marker = {
      key: forgetMarkerKey(prefix, s.tenant, s.agent),
      value: forgetMarkerValue(s.forgets, at),
    };
    if (messageBytes(marker) > maxBytes) tooLarge++;
    else {
      records.push(marker);
      markers++;
    }
  }
  const sent = records.filter((r) => r.value !== null || messageBytes(r) <= maxBytes);
  return { records: sent, markers, tooLarge, tombstonesLeftOut: records.length - sent.length };
}

const FORGET_LEASE_LOST = {
  [-3]: { code: 'STATE_CONTENDED' as const, message: 'scope lease lost: forget again' },
};
const forgetReply = z.tuple([z.union([z.literal(0), z.literal(1)]), z.number().int().positive()]);
