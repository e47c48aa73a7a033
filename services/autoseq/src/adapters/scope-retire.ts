import type { Redis } from 'ioredis';
import { z } from 'zod';
import { errorMessage } from '../../../../shared/errors.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Logger } from '../../../../shared/log.js';
import { execPipeline } from '../../../../shared/redis/replies.js';
import { invokeScript } from '../../../../shared/redis/scripts.js';
import { scopeId } from '../core/learn/engine.js';
import { contextRecordKey, scopeRecordKey } from './kafka/rules-log.js';
import { learnKey, type ContextsWritten } from './redis/learn-store.js';
import { defineScopeScripts, ScopeLeases, type ScopeRef } from './redis/scope-lease.js';

/**
 * Retiring idle scopes from the rules topic. Redis forgets a scope idle for AUTOSEQ_LEARN_SCOPE_TTL_MS by
 * itself (its rules hash expires), but compaction keeps the scope's records in the rules topic for ever: where
 * scope ids come and go (a run id in `agent_id`), the topic grew without bound and every restore read all of
 * it. So, while the topic copy is on, the hash is given a grace beyond the TTL, and a sweep retires a scope
 * once it has been idle for the TTL: under the scope's lease it tombstones the scope's records (one per field
 * of the hash: the contexts the topic holds) and then deletes the hash, fenced by the lease as a batch's write
 * is. A scope that comes back afterwards starts afresh, as it would have after the expiry.
 *
 * The sweep finds scopes in a registry (a set of `[tenant, agent]`), written by the copy: a scope with nothing
 * in the topic has nothing to retire, and Redis's expiry alone takes it. The copy registers under the lease
 * and the sweep unregisters under it, so a scope revived right after its retirement is registered again by
 * its first copy, never left out.
 */

/** `<prefix>:aseq:scopes`: the scopes whose records the rules topic may hold. */
export const scopeRegistryKey = (prefix: string): string => `${prefix}:aseq:scopes`;
const member = (s: { tenant: string; agent: string }) => JSON.stringify([s.tenant, s.agent]);
const memberShape = z.tuple([z.string().min(1), z.string().min(1)]);

/** Scopes retired per round trip (and per set of leases held at once). */
const SCOPES_PER_ROUND = 32;
/** Registry members read per SSCAN page. */
const SCAN_COUNT = 500;

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

export type RetireOutcome = 'retired' | 'gone' | 'expired_at_restore';

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
  onRetired: (outcome: RetireOutcome, scopes: number) => void;
  /**
   * A retirement cut short after some of its tombstones may have gone out, with the state kept (its lease ran
   * out, the send failed): the scope's contexts are copied again, so the topic holds them once more.
   */
  recopy: (written: ContextsWritten[]) => void;
}

export class ScopeRetirement {
  private timer: NodeJS.Timeout | null = null;
  private sweeping: Promise<unknown> | null = null;
  private stopped = false;

  constructor(private readonly s: ScopeRetirementSpec) {
    defineScopeScripts(s.redis);
  }

  /** Adds scopes to the registry (the copy, under their leases; the restore, for the scopes it wrote). */
  async register(scopes: readonly { tenant: string; agent: string }[]): Promise<void> {
    if (scopes.length === 0) return;
    await this.s.redis.sadd(scopeRegistryKey(this.s.prefix), ...scopes.map(member));
  }

  start(intervalMs: number): void {
    const tick = () => {
      this.timer = setTimeout(() => {
        this.sweeping = this.sweep()
          .catch((err: unknown) =>
            this.s.log.warn({ err: errorMessage(err) }, 'idle scope sweep failed; trying again'),
          )
          .finally(() => {
            this.sweeping = null;
            if (!this.stopped) tick();
          });
      }, intervalMs);
      this.timer.unref();
    };
    tick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.sweeping;
  }

  /** One pass over the registry: every scope idle for the TTL is retired; one whose hash is gone is dropped. */
  async sweep(): Promise<{ retired: number; gone: number }> {
    const { redis, prefix } = this.s;
    const total = { retired: 0, gone: 0 };
    if (this.s.paused()) return total;
    let cursor = '0';
    do {
      const [next, members] = await redis.sscan(scopeRegistryKey(prefix), cursor, 'COUNT', SCAN_COUNT);
      cursor = next;
      const refs: ScopeRef[] = [];
      for (const m of members) {
        const r = memberShape.safeParse(parseJson(m));
        if (r.success) refs.push({ id: scopeId(r.data[0], r.data[1]), tenant: r.data[0], agent: r.data[1] });
      }
      if (refs.length === 0) continue;
      const pipe = redis.pipeline();
      for (const r of refs) pipe.pttl(learnKey(prefix, r.tenant, r.agent));
      const ttls = await execPipeline(pipe, 'idle scope sweep');
      // -2: no hash (expired, or lost with Redis); -1: written without a TTL (expiry was off), left alone.
      const due = refs.filter((_, i) => {
        const left = ttls[i] as number;
        return left === -2 || (left >= 0 && left <= this.s.graceMs);
      });
      for (let i = 0; i < due.length && !this.stopped && !this.s.paused(); i += SCOPES_PER_ROUND) {
        const r = await this.retireRound(due.slice(i, i + SCOPES_PER_ROUND));
        total.retired += r.retired;
        total.gone += r.gone;
      }
    } while (cursor !== '0' && !this.stopped && !this.s.paused());
    return total;
  }

  private async retireRound(refs: ScopeRef[]): Promise<{ retired: number; gone: number }> {
    const { redis, prefix } = this.s;
    const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
    const pipe = redis.pipeline();
    const took = leases.tryAll(pipe, refs);
    for (const r of refs) {
      pipe.pttl(learnKey(prefix, r.tenant, r.agent));
      pipe.hkeys(learnKey(prefix, r.tenant, r.agent));
    }
    try {
      const replies = await execPipeline(pipe, 'idle scope read');
      took(replies.slice(0, refs.length));
      // A scope whose lease another holds is being learned in or copied: not idle, whatever its TTL said.
      const held = new Set(leases.holding().map((s) => s.id));
      const reads = replies.slice(refs.length);
      const gone: ScopeRef[] = [];
      const retiring: (ScopeRef & { ctxs: string[] })[] = [];
      refs.forEach((r, i) => {
        if (!held.has(r.id)) return;
        const left = reads[2 * i] as number;
        const fields = reads[2 * i + 1] as string[];
        if (left === -2) gone.push(r);
        else if (left >= 0 && left <= this.s.graceMs)
          retiring.push({ ...r, ctxs: fields.filter((f) => f.startsWith('c:')).map((f) => f.slice(2)) });
      });
      const retired = retiring.length > 0 ? await this.retire(leases, retiring) : [];
      const out = [...gone, ...retired];
      // Still under the leases: a copy that registers a revived scope again comes after this.
      if (out.length > 0) await redis.srem(scopeRegistryKey(prefix), ...out.map(member));
      if (retired.length > 0) this.s.onRetired('retired', retired.length);
      if (gone.length > 0) this.s.onRetired('gone', gone.length);
      return { retired: retired.length, gone: gone.length };
    } finally {
      await leases.release();
    }
  }

  /** Tombstones, then the fenced delete; what was not deleted is copied again. Returns the scopes deleted. */
  private async retire(leases: ScopeLeases, scopes: (ScopeRef & { ctxs: string[] })[]): Promise<ScopeRef[]> {
    const { redis, prefix } = this.s;
    let deleted: ScopeRef[] = [];
    try {
      await this.s.sink.sendRaw(this.s.topic, tombstones(prefix, scopes));
      // A send that outlasted the leases: a batch may have written since; the delete below then refuses.
      await leases.keepFresh();
      const del = redis.pipeline();
      for (const s of scopes)
        invokeScript(
          del,
          'retireScope',
          [leases.leaseKey(s), learnKey(prefix, s.tenant, s.agent)],
          [leases.token],
        );
      const replies = await execPipeline(del, 'idle scope delete');
      deleted = scopes.filter((_, i) => replies[i] === 1);
      return deleted;
    } finally {
      const kept = scopes.filter((s) => !deleted.includes(s));
      if (kept.length > 0)
        this.s.recopy(kept.map((s) => ({ tenant: s.tenant, agent: s.agent, ctxs: s.ctxs })));
    }
  }

  /**
   * The restore's part: scopes whose latest copy is older than the TTL are not brought back, and their records
   * are tombstoned, unless the scope has state by now (it came back: its copies overwrite them). Under the
   * scopes' leases, as the sweep. Returns how many scopes were tombstoned.
   */
  async tombstoneExpired(
    scopes: readonly { tenant: string; agent: string; ctxs: Iterable<string> }[],
  ): Promise<number> {
    const { redis, prefix } = this.s;
    let done = 0;
    for (let i = 0; i < scopes.length; i += SCOPES_PER_ROUND) {
      const round = scopes.slice(i, i + SCOPES_PER_ROUND).map((s) => ({
        id: scopeId(s.tenant, s.agent),
        tenant: s.tenant,
        agent: s.agent,
        ctxs: [...s.ctxs],
      }));
      const leases = new ScopeLeases(redis, prefix, { ttlMs: this.s.leaseMs });
      try {
        await leases.acquire(round);
        const pipe = redis.pipeline();
        for (const s of round) pipe.exists(learnKey(prefix, s.tenant, s.agent));
        const exists = await execPipeline(pipe, 'expired scope check');
        const absent = round.filter((_, j) => exists[j] === 0);
        if (absent.length === 0) continue;
        await this.s.sink.sendRaw(this.s.topic, tombstones(prefix, absent));
        await leases.keepFresh();
        done += absent.length;
      } finally {
        await leases.release();
      }
    }
    if (done > 0) this.s.onRetired('expired_at_restore', done);
    return done;
  }
}

/** A scope's records as tombstones: its contexts first, its scope record last. */
function tombstones(
  prefix: string,
  scopes: readonly { tenant: string; agent: string; ctxs: readonly string[] }[],
): { key: string; value: null }[] {
  return scopes.flatMap((s) => [
    ...s.ctxs.map((c) => ({ key: contextRecordKey(prefix, s.tenant, s.agent, c), value: null })),
    { key: scopeRecordKey(prefix, s.tenant, s.agent), value: null },
  ]);
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
