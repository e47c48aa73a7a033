import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ChainableCommander, Redis } from 'ioredis';
import { PaverError } from '../../../../../shared/errors.js';
import { scopeTag } from '../../../../../shared/redis/keys.js';
import { execPipeline } from '../../../../../shared/redis/replies.js';
import {
  defineScripts,
  invokeScript,
  readScripts,
  type ScriptFile,
} from '../../../../../shared/redis/scripts.js';

/**
 * Scope leases: a batch holds the lease of every scope it learns in, from its read to its write, so two
 * instances (or two partitions consumed concurrently) never read-modify-write one scope's learned state at
 * once. Without them the last writer of a context won and the other batch's learning was lost, and the
 * scope's counts (which decide eviction) drifted from its fields. The write checks the lease (fencing): a
 * batch that held it past its TTL writes nothing and is retried from a fresh read.
 */

export const SCRIPT_DIR = fileURLToPath(new URL('./lua/', import.meta.url));
export const SCRIPTS = [
  'forgetFloor',
  'forgetScope',
  'learnRestore',
  'learnSave',
  'leaseAcquire',
  'leaseRelease',
  'leaseRenew',
  'retireScope',
] as const;
let files: ScriptFile[] | null = null;
/** Registers the scope scripts on a connection (once; the files are read once per process). */
export function defineScopeScripts(redis: Redis): void {
  files ??= readScripts(SCRIPT_DIR, [...SCRIPTS]);
  defineScripts(redis, files);
}

/** `<prefix>:aseq:{tenant|agent}:lease`: the token of the batch holding the scope. */
export const leaseKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:lease`;
/** `<prefix>:aseq:{tenant|agent}:want`: the token of the batch that waits for the scope first. */
export const wantKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:want`;

export interface LeaseOptions {
  /** How long a lease lasts without a write (a batch that died holding it blocks the scope this long). */
  ttlMs: number;
  /** Kept alive while waiting (the consumer's heartbeat): a wait can last up to twice the TTL. */
  heartbeat?: () => Promise<void>;
  /** Called once per batch that had to wait for a lease. */
  onWait?: () => void;
  /** False once the consumer stops or rebalances: a waiting batch gives up at once. */
  isRunning?: () => boolean;
}

export interface ScopeRef {
  id: string;
  tenant: string;
  agent: string;
}

/** Leases are always taken in this one order (see `acquire`). */
const inScopeOrder = (scopes: readonly ScopeRef[]) =>
  [...scopes].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));

/** The leases of one batch: taken by `acquire`, given back by the save script or by `release`. */
export class ScopeLeases {
  readonly token = randomUUID();
  private held: ScopeRef[] = [];
  /** Every scope this batch asked for (a give-up withdraws its waiting marks on all of them). */
  private asked: ScopeRef[] = [];
  private takenAt = 0;

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly opts: LeaseOptions,
  ) {}

  leaseKey(s: { tenant: string; agent: string }): string {
    return leaseKey(this.prefix, s.tenant, s.agent);
  }

  private queueAcquire(pipe: ChainableCommander, s: ScopeRef): void {
    invokeScript(
      pipe,
      'leaseAcquire',
      [this.leaseKey(s), wantKey(this.prefix, s.tenant, s.agent)],
      [this.token, this.opts.ttlMs],
    );
  }

  /**
   * Queues one acquisition per scope on `pipe` (the caller's first read rides the same round trip) and
   * returns how to read the replies: true when every lease was taken.
   */
  tryAll(pipe: ChainableCommander, scopes: ScopeRef[]): (replies: unknown[]) => boolean {
    const sorted = inScopeOrder(scopes);
    this.asked = sorted;
    for (const s of sorted) this.queueAcquire(pipe, s);
    return (replies) => {
      const got = sorted.filter((_, i) => replies[i] === 1);
      this.held = got;
      this.takenAt = Date.now();
      return got.length === sorted.length;
    };
  }

  /**
   * Takes every lease of `scopes`, waiting for those another batch holds. Leases are taken in scope order
   * and only a prefix of that order is kept while waiting, so batches waiting for each other cannot form a
   * cycle; each poll asks for the first missing scope only, and extends the leases already held (a wait can
   * outlast them). Gives up (retriable) after twice the TTL, by when a holder that died has lost its lease,
   * or as soon as the consumer stops (a rebalance, a shutdown).
   */
  async acquire(scopes: ScopeRef[]): Promise<void> {
    const sorted = inScopeOrder(scopes);
    // What `tryAll` took or marked: nothing, for a batch that begins here (a copy round, a retirement round).
    const touched = new Set(this.asked.map((s) => s.id));
    this.asked = sorted;
    const have = new Set(this.held.map((s) => s.id));
    // Keep the longest sorted prefix already held; what was taken beyond a gap goes back first, and so do the
    // waiting marks `tryAll` left there: the wait goes one scope at a time, and a mark on a scope after the one
    // waited for kept every other batch off it, free, until this one got there (two such waiters stalled each
    // other until a mark lapsed). Each scope is marked again when its turn comes.
    let prefix = 0;
    while (prefix < sorted.length && have.has(sorted[prefix]!.id)) prefix++;
    // Only those: a release of scopes never asked for cost a round trip of scripts that found nothing to give back.
    await this.releaseSome(sorted.slice(prefix + 1).filter((s) => touched.has(s.id)));
    this.held = sorted.slice(0, prefix);
    this.opts.onWait?.();
    const deadline = Date.now() + 2 * this.opts.ttlMs;
    let pause = 2;
    while (this.held.length < sorted.length) {
      const next = sorted[this.held.length]!;
      const pipe = this.redis.pipeline();
      // The held ones first: the script extends a lease that is the caller's already.
      for (const s of [...this.held, next]) this.queueAcquire(pipe, s);
      const replies = await execPipeline(pipe, 'scope lease acquire');
      if (replies.slice(0, this.held.length).some((r) => r !== 1)) {
        await this.release().catch(() => undefined);
        throw lost();
      }
      this.takenAt = Date.now();
      if (replies[this.held.length] === 1) {
        this.held.push(next);
        continue;
      }
      const stop = this.opts.isRunning?.() === false;
      if (stop || Date.now() > deadline) {
        await this.release().catch(() => undefined);
        throw new PaverError(
          'STATE_CONTENDED',
          stop
            ? 'stopped waiting for a scope lease: the consumer is stopping or rebalancing'
            : `learned state of a scope held by another batch for over ${2 * this.opts.ttlMs} ms (AUTOSEQ_LEARN_LEASE_MS)`,
        );
      }
      await this.opts.heartbeat?.().catch(() => undefined);
      // Jittered so that waiters of one scope do not poll in step.
      await sleep(pause * (0.5 + Math.random()));
      pause = Math.min(pause * 2, 100);
    }
  }

  /**
   * Around publishing: a batch that has held its leases for a quarter of their TTL extends them, before it
   * publishes and again after, so a slow batch or a slow send still holds them when it writes. A lease
   * already lost means another batch may have written: this one is retried from a fresh read. `always`: checks
   * (and extends) them whatever their age: a retirement must know that no copy of a revived scope came between
   * its read and its tombstones, and relies on the check rather than on the clock.
   */
  async keepFresh(always = false): Promise<void> {
    if (this.held.length === 0 || (!always && Date.now() - this.takenAt < this.opts.ttlMs / 4)) return;
    const pipe = this.redis.pipeline();
    for (const s of this.held)
      invokeScript(pipe, 'leaseRenew', [this.leaseKey(s)], [this.token, this.opts.ttlMs]);
    const replies = await execPipeline(pipe, 'scope lease renew');
    this.takenAt = Date.now();
    if (replies.some((r) => r !== 1)) {
      await this.release().catch(() => undefined);
      throw lost();
    }
  }

  /** Gives back every lease still held and withdraws every waiting mark (a batch that failed before its write). */
  async release(): Promise<void> {
    this.held = [];
    await this.releaseSome(this.asked);
  }

  /** The scopes whose leases this batch holds now. */
  holding(): readonly ScopeRef[] {
    return this.held;
  }

  /** The save script released them. */
  released(): void {
    this.held = [];
  }

  private async releaseSome(scopes: ScopeRef[]): Promise<void> {
    if (scopes.length === 0) return;
    const pipe = this.redis.pipeline();
    for (const s of scopes)
      invokeScript(
        pipe,
        'leaseRelease',
        [this.leaseKey(s), wantKey(this.prefix, s.tenant, s.agent)],
        [this.token],
      );
    await execPipeline(pipe, 'scope lease release');
  }
}

/** A write refused because the batch no longer held a scope's lease: retriable, from a fresh read. */
const LOST = {
  code: 'STATE_CONTENDED' as const,
  message:
    'scope lease lost before the learned state was written (held past AUTOSEQ_LEARN_LEASE_MS, or Redis lost its state)',
};
const lost = () => new PaverError(LOST.code, LOST.message);
/** learnSave-n.lua's status -3, for `parseScriptReply`. */
export const LEASE_LOST_CODES = { [-3]: LOST };
