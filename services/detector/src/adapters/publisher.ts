import { randomUUID } from 'node:crypto';
import { errorMessage } from '../../../../shared/errors.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Logger } from '../../../../shared/log.js';
import type { FlowCandidate } from '../../../../schemas/index.js';
import { candidateKey, diffCandidates, retractedRecord, toRecord } from '../core/candidate.js';
import { liveCandidates } from '../core/detect.js';
import { scopeId, type Scope } from '../core/ops.js';
import type { DetectorParams } from '../core/params.js';
import type { MarkerWatch, RedisDetectorStore } from './redis/store.js';

export interface PublisherDeps {
  store: RedisDetectorStore;
  sink: Sink;
  topic: string;
  params: DetectorParams;
  log: Logger;
  onPublished: (status: 'active' | 'retracted', n: number) => void;
  /**
   * A publication of a change an instance applied and never published (it died): found by a later batch of the
   * scope, or by the retry after a dead holder's lock ran out.
   */
  onRecovered?: (via: 'batch' | 'retry' | 'sweep') => void;
  /** DETECTOR_SCOPE_TTL_MS (30 days unless set): the sweep retires scopes idle for this long; 0 or absent: never. */
  scopeTtlMs?: number;
  /** A scope the sweep retired (`retired`), or found active again between its two steps (`revived`). */
  onRetired?: (outcome: 'retired' | 'revived') => void;
  /**
   * The sweep acts only on scopes whose every partition is rebuilt (or found complete) in the current Redis epoch,
   * as a batch does (the service sets it; a store used without epochs, as in most tests, has no such marks).
   */
  sweepRebuiltOnly?: boolean;
}

/** A scope's upserted and retracted candidates, stamped `stamp`, to the flow-candidates topic; counted. */
async function sendCandidates(
  d: PublisherDeps,
  scope: Scope,
  upserts: readonly FlowCandidate[],
  retracts: readonly string[],
  stamp: number,
): Promise<void> {
  await d.sink.send(
    d.topic,
    'flow-candidates.v1',
    [
      ...upserts.map((c) => ({ key: candidateKey(scope, c.dedupe_key), value: toRecord(c, scope, stamp) })),
      ...retracts.map((k) => ({ key: candidateKey(scope, k), value: retractedRecord(k, scope, stamp) })),
    ],
    // One over PAVER_MAX_OUTPUT_BYTES (a long task repeated: its steps, title and flow name, each a thousand
    // long tool names) is left out, counted (`paver_outputs_oversize_total`) and logged, as any service's
    // oversized output is. Kept, it failed the send as INTERNAL: the detector stopped, and again after every
    // restart, since the change stays owed. The published map still takes it, so it is not tried again
    // until it changes.
    () => null,
  );
  if (upserts.length) d.onPublished('active', upserts.length);
  if (retracts.length) d.onPublished('retracted', retracts.length);
}

/**
 * Publishes a scope's changed candidates. Serialised per scope through a Redis lock: an instance that finds
 * the lock taken leaves a dirty mark, and the holder publishes again before releasing, so the last state
 * published is always the newest and no change is lost between instances. When the lock was held elsewhere,
 * returns its remaining time and Redis's time then; else null.
 */
export async function publishScope(
  d: PublisherDeps,
  scope: Scope,
  how: { markDirty: boolean; onClaimed?: () => void },
): Promise<{ remainingMs: number; redisNowMs: number } | null> {
  const token = randomUUID();
  const ttl = d.store.publicationLockMs;
  // The lock, the owed count, the published map and the snapshot in one round trip; a second pass (the scope
  // changed while this one published) reads a fresh snapshot under the lock it still holds.
  const claimed = await d.store.claimSnapshot(scope, token, ttl, how.markDirty);
  if (claimed.held) return claimed;
  how.onClaimed?.();
  let { published, snapshot: snap, owed, stamp: now } = claimed;
  try {
    for (;;) {
      const live = liveCandidates(snap.stats, d.params, snap.records);
      const { upserts, retracts, next } = diffCandidates(published, live);
      // `detected_at` is the scope's publication stamp (Redis's clock, increasing per scope), not this host's
      // clock: with instances' clocks apart, a retraction published after an upsert by another instance could be
      // stamped earlier, and flows would drop it as stale.
      await sendCandidates(d, scope, upserts, retracts, now);
      const r = await d.store.release(
        scope,
        token,
        ttl,
        owed,
        upserts.map((c) => [c.dedupe_key, next.get(c.dedupe_key)!]),
        retracts,
      );
      if (!r.again) return null;
      published = next;
      owed = r.owed;
      snap = await d.store.snapshot(scope);
      now = await d.store.stamp(scope);
    }
  } catch (err) {
    // The change stays owed (nothing was released). The lock is given up so that the retry that follows
    // (ScopePublisher.retryFailed) need not wait out its TTL; if Redis is what failed, the TTL frees it.
    await d.store.unlock(scope, token).catch(() => false);
    throw err;
  }
}

/** The first retry of a failed publication, doubled after each failure up to the lock's TTL. */
export const FAILED_RETRY_MS = 1_000;

/**
 * Retires a scope idle for `idleMs`: under its publication lock, retracts every candidate published for it, then
 * deletes its state unless an apply came in meanwhile (retireClaim-4.lua, retireFinish-15.lua). `skipped` when
 * it is not idle after all, has no state, or a publication holds its lock.
 * Dying between the two steps leaves the lock to run out and the scope marked `retiring`: the next sweep retires
 * it again, or its next publication sends every live candidate again (flows may have taken the retractions).
 * With `watch`, each of its round trips reads the epoch marker too (the sweep's check before its next scope).
 */
export async function retireScope(
  d: PublisherDeps,
  scope: Scope,
  partitions: readonly number[],
  idleMs: number,
  watch?: MarkerWatch,
): Promise<'retired' | 'active' | 'lost' | 'skipped'> {
  const token = randomUUID();
  const claim = await d.store.retireClaim(scope, token, idleMs, watch);
  if (claim === 'gone') {
    // Registered, yet no state (its apply refused to write, or failed): nothing to retire, only the entry.
    await d.store.unregister(scope, partitions, watch);
    return 'skipped';
  }
  if (!claim) return 'skipped';
  await sendCandidates(d, scope, [], claim.keys, claim.stamp);
  return d.store.retireFinish(scope, token, idleMs, partitions, watch);
}

/**
 * publishScope for the batches. A change is owed in Redis from its apply until a publication that saw it
 * releases (apply-11.lua, release-4.lua), which covers an instance dying in between:
 * - a batch of the scope that finds a change owed for longer than a publication may take publishes it (a
 *   redelivery of the dead one's batch finds only duplicates, so nothing "changed"); without marking the scope
 *   dirty;
 * - a publication that finds the lock held is tried again once the lock's time is up, if a change owed since
 *   then (or earlier) is still owed: its holder may have died, and then the dirty mark left for it is never
 *   read. A live holder has published it by then (its release clears the count, or moves `owedAt` past it),
 *   and the check costs one HMGET.
 * Retries still waiting at shutdown are dropped: the change stays owed in Redis, and a batch of the scope on
 * any instance publishes it once it is old enough, or else the sweep does (`sweepEvery`).
 */
export class ScopePublisher {
  private readonly retries = new Map<string, NodeJS.Timeout>();
  private readonly running = new Set<Promise<void>>();
  private closed = false;
  constructor(private readonly d: PublisherDeps) {}

  /** `changed`: this batch changed the scope (else it found an abandoned change owed). */
  async publish(scope: Scope, changed: boolean): Promise<void> {
    if (!changed) return this.recover(scope, 'batch');
    let held;
    try {
      held = await publishScope(this.d, scope, { markDirty: true });
    } catch (err) {
      this.retryFailed(scope);
      throw err;
    }
    if (held) this.retryLater(scope, held.remainingMs, held.redisNowMs);
  }

  /**
   * Publishes a change another instance may have abandoned: without marking the scope dirty (a live holder may
   * be publishing it), counted as recovered if the lock is taken, and retried when a held lock runs out.
   */
  private async recover(scope: Scope, via: 'batch' | 'retry' | 'sweep', since?: number): Promise<void> {
    let held;
    try {
      held = await publishScope(this.d, scope, {
        markDirty: false,
        onClaimed: () => this.d.onRecovered?.(via),
      });
    } catch (err) {
      this.retryFailed(scope);
      throw err;
    }
    if (held) this.retryLater(scope, held.remainingMs, since ?? held.redisNowMs);
  }

  /**
   * A publication of this instance failed (the send, or Redis around it): the change is still owed, and this
   * instance knows it, so it tries again in FAILED_RETRY_MS, doubling after each failure up to the lock's TTL.
   * The batch's redelivery cannot: it finds only duplicates, and a change that young is left to its own
   * publication (a live holder may be sending it), so the change would wait for a later batch of the scope or
   * the sweep (up to about 90 s). This retry replaces one waiting for a held lock: it publishes whatever is owed.
   */
  private retryFailed(scope: Scope, attempt = 0): void {
    const ms = Math.min(this.d.store.publicationLockMs, FAILED_RETRY_MS * 2 ** attempt);
    this.schedule(
      scope,
      ms,
      async () => {
        try {
          if (this.closed || !(await this.d.store.isOwed(scope))) return;
          const held = await publishScope(this.d, scope, { markDirty: false });
          if (held) this.retryLater(scope, held.remainingMs, held.redisNowMs);
        } catch (err) {
          this.d.log.warn(
            { err: errorMessage(err) },
            'candidate publication failed again; trying again later',
          );
          this.retryFailed(scope, attempt + 1);
        }
      },
      true,
    );
  }

  /** Scopes waiting for a held lock's time to be up. */
  get waiting(): number {
    return this.retries.size;
  }

  private retryLater(scope: Scope, ms: number, since: number): void {
    this.schedule(scope, ms + 50, () =>
      this.retry(scope, since).catch((err: unknown) => {
        this.d.log.warn({ err: errorMessage(err) }, 'owed publication failed; trying again later');
        this.retryLater(scope, this.d.store.publicationLockMs, since);
      }),
    );
  }

  /**
   * One waiting retry per scope: a second one while one waits is dropped (the first publishes the newest state),
   * unless it is to `replace` it.
   */
  private schedule(scope: Scope, ms: number, run: () => Promise<void>, replace = false): void {
    const id = scopeId(scope);
    if (this.closed) return;
    const waiting = this.retries.get(id);
    if (waiting && !replace) return;
    clearTimeout(waiting);
    const t = setTimeout(() => {
      this.retries.delete(id);
      const p = run().finally(() => this.running.delete(p));
      this.running.add(p);
    }, ms);
    t.unref();
    this.retries.set(id, t);
  }

  private async retry(scope: Scope, since: number): Promise<void> {
    if (this.closed || !(await this.d.store.isOwed(scope, since))) return;
    await this.recover(scope, 'retry', since);
  }

  /**
   * Publishes every scope whose change was abandoned and that no batch took up (its scope gets none): after a
   * restart, or a retry dropped at shutdown; and retires the scopes idle for `scopeTtlMs`. The service runs it
   * on a timer.
   *
   * With `sweepRebuiltOnly`, a scope on a partition not rebuilt in the current epoch is left alone until it is.
   * Its state may be lost (what a batch wrote into an emptied Redis before the loss was seen), or a rebuild may
   * be replaying it, owed since the replay's first change: with the publication maps not yet restored (a loss),
   * a publication then sent the candidates of a window part-way through its history (some retracted before the
   * loss), and with the maps intact (an epoch ended without a loss) it retracted every candidate the replay had
   * not reached yet. The rebuild publishes the scope itself once done. The marker is read again before each
   * scope: a loss during the sweep ends it.
   */
  async sweep(): Promise<void> {
    const gated = this.d.sweepRebuiltOnly === true;
    const { abandoned, idle, held, epoch } = await this.d.store.scan(this.d.scopeTtlMs ?? 0, {
      rebuiltOnly: gated,
    });
    if (held > 0)
      this.d.log.info(
        { scopes: held },
        'sweep skipped scopes whose partitions are not rebuilt in the current Redis epoch (state lost or being rebuilt)',
      );
    // The marker is read before each scope acted on, by the last round trip made before it when that one can
    // carry the read (the scan's for the first scope, a retirement's last for the next), else by a GET of its
    // own (after a publication). Either way it is read after everything done for the scope before.
    const watch: MarkerWatch | undefined = gated && epoch ? { epoch, still: true } : undefined;
    const goOn = async () => {
      if (this.closed) return false;
      if (!watch) return true;
      const still = watch.still ?? (await this.d.store.epochIs(watch.epoch));
      delete watch.still;
      if (still) return true;
      this.d.log.info('sweep stopped: the Redis epoch changed while it ran (state lost)');
      return false;
    };
    for (const scope of abandoned) {
      if (!(await goOn())) return;
      await this.recover(scope, 'sweep');
    }
    for (const { scope, partitions } of idle) {
      if (!(await goOn())) return;
      const outcome = await retireScope(this.d, scope, partitions, this.d.scopeTtlMs!, watch);
      if (outcome === 'retired') this.d.onRetired?.('retired');
      // An event came in between the two steps: the scope is kept and published again, whole.
      if (outcome === 'active') {
        if (watch) delete watch.still;
        this.d.onRetired?.('revived');
        await this.publish(scope, true);
      }
    }
  }

  private sweeper: NodeJS.Timeout | null = null;
  /** Sweeps every `ms` (one at a time), until closed. */
  sweepEvery(ms: number): void {
    let running = false;
    this.sweeper = setInterval(() => {
      if (running || this.closed) return;
      running = true;
      const run = this.sweep()
        .catch((err: unknown) =>
          this.d.log.warn({ err: errorMessage(err) }, 'sweep for unpublished changes failed; trying again'),
        )
        .finally(() => {
          running = false;
          this.running.delete(run);
        });
      this.running.add(run);
    }, ms);
    this.sweeper.unref();
  }

  /** Drops the retries still waiting, and waits for one already running (the producer and Redis close next). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.sweeper) clearInterval(this.sweeper);
    for (const t of this.retries.values()) clearTimeout(t);
    this.retries.clear();
    await Promise.allSettled([...this.running]);
  }
}
