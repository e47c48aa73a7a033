import { randomUUID } from 'node:crypto';
import { errorMessage } from '../../../../shared/errors.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Logger } from '../../../../shared/log.js';
import { candidateKey, diffCandidates, retractedRecord, toRecord } from '../core/candidate.js';
import { liveCandidates } from '../core/detect.js';
import { scopeId, type Scope } from '../core/ops.js';
import type { DetectorParams } from '../core/params.js';
import type { RedisDetectorStore } from './redis/store.js';

const LOCK_TTL_MS = 30_000;

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
  onRecovered?: (via: 'batch' | 'retry') => void;
}

/**
 * Publishes a scope's changed candidates. Serialised per scope through a Redis lock: an instance that finds
 * the lock taken leaves a dirty mark, and the holder publishes again before releasing, so the last state
 * published is always the newest and no change is lost between instances. Returns the lock's remaining time
 * when it was held elsewhere, else null.
 */
export async function publishScope(
  d: PublisherDeps,
  scope: Scope,
  how: { markDirty: boolean; onClaimed?: () => void },
): Promise<number | null> {
  const token = randomUUID();
  // The lock, the owed count, the published map and the snapshot in one round trip; a second pass (the scope
  // changed while this one published) reads a fresh snapshot under the lock it still holds.
  const claimed = await d.store.claimSnapshot(scope, token, LOCK_TTL_MS, how.markDirty);
  if (claimed.held) return claimed.remainingMs;
  how.onClaimed?.();
  let { published, snapshot: snap, owed } = claimed;
  for (;;) {
    const live = liveCandidates(snap.stats, d.params, snap.records);
    const { upserts, retracts, next } = diffCandidates(published, live);
    const now = Date.now();
    await d.sink.send(d.topic, 'flow-candidates.v1', [
      ...upserts.map((c) => ({ key: candidateKey(scope, c.dedupe_key), value: toRecord(c, scope, now) })),
      ...retracts.map((k) => ({ key: candidateKey(scope, k), value: retractedRecord(k, scope, now) })),
    ]);
    if (upserts.length) d.onPublished('active', upserts.length);
    if (retracts.length) d.onPublished('retracted', retracts.length);
    const r = await d.store.release(
      scope,
      token,
      LOCK_TTL_MS,
      owed,
      upserts.map((c) => [c.dedupe_key, next.get(c.dedupe_key)!]),
      retracts,
    );
    if (!r.again) return null;
    published = next;
    owed = r.owed;
    snap = await d.store.snapshot(scope);
  }
}

/**
 * publishScope for the batches. A change is owed in Redis from its apply until a publication that saw it
 * releases (apply-11.lua, release-4.lua), which covers an instance dying in between:
 * - a later batch of the scope finds it owed (a redelivery of the dead one's batch finds only duplicates, so
 *   nothing "changed") and publishes it; without marking the scope dirty, as a live holder may be publishing
 *   it right now;
 * - a publication that finds the lock held is tried again once the lock's time is up, if the scope is still
 *   owed: its holder may have died, and then the dirty mark left for it is never read. A live holder has
 *   published the change by then, and the retry costs one HEXISTS.
 * Retries still waiting at shutdown are dropped: the change stays owed in Redis, and the next batch of the scope
 * on any instance publishes it.
 */
export class ScopePublisher {
  private readonly retries = new Map<string, NodeJS.Timeout>();
  private closed = false;
  constructor(private readonly d: PublisherDeps) {}

  /** `changed`: this batch changed the scope (else it was found owed). */
  async publish(scope: Scope, changed: boolean): Promise<void> {
    const heldMs = await publishScope(this.d, scope, {
      markDirty: changed,
      onClaimed: changed ? undefined : () => this.d.onRecovered?.('batch'),
    });
    if (heldMs !== null) this.retryLater(scope, heldMs);
  }

  /** Scopes waiting for a held lock's time to be up. */
  get waiting(): number {
    return this.retries.size;
  }

  private retryLater(scope: Scope, ms: number): void {
    const id = scopeId(scope);
    if (this.closed || this.retries.has(id)) return;
    const t = setTimeout(() => {
      this.retries.delete(id);
      void this.retry(scope).catch((err: unknown) => {
        this.d.log.warn({ err: errorMessage(err) }, 'owed publication failed; trying again later');
        this.retryLater(scope, LOCK_TTL_MS);
      });
    }, ms + 50);
    t.unref();
    this.retries.set(id, t);
  }

  private async retry(scope: Scope): Promise<void> {
    if (this.closed || !(await this.d.store.isOwed(scope))) return;
    const heldMs = await publishScope(this.d, scope, {
      markDirty: false,
      onClaimed: () => this.d.onRecovered?.('retry'),
    });
    if (heldMs !== null) this.retryLater(scope, heldMs);
  }

  close(): void {
    this.closed = true;
    for (const t of this.retries.values()) clearTimeout(t);
    this.retries.clear();
  }
}
