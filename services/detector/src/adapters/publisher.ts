import { randomUUID } from 'node:crypto';
import type { Sink } from '../../../../shared/kafka/sink.js';
import { candidateKey, diffCandidates, retractedRecord, toRecord } from '../core/candidate.js';
import { liveCandidates } from '../core/detect.js';
import type { Scope } from '../core/ops.js';
import type { DetectorParams } from '../core/params.js';
import type { RedisDetectorStore } from './redis/store.js';

const LOCK_TTL_MS = 30_000;

/**
 * Publishes a scope's changed candidates. Serialised per scope through a Redis lock: an instance that finds
 * the lock taken leaves a dirty mark, and the holder publishes again before releasing, so the last state
 * published is always the newest and no change is lost between instances.
 */
export async function publishScope(
  store: RedisDetectorStore,
  sink: Sink,
  topic: string,
  params: DetectorParams,
  scope: Scope,
  onPublished: (status: 'active' | 'retracted', n: number) => void,
): Promise<void> {
  const token = randomUUID();
  // The lock, the published map and the snapshot in one round trip; a second pass (the scope changed while
  // this one published) reads a fresh snapshot under the lock it still holds.
  const claimed = await store.claimSnapshot(scope, token, LOCK_TTL_MS);
  if (!claimed) return;
  let published = claimed.published;
  let snap = claimed.snapshot;
  for (;;) {
    const live = liveCandidates(snap.stats, params, snap.records);
    const { upserts, retracts, next } = diffCandidates(published, live);
    const now = Date.now();
    await sink.send(topic, 'flow-candidates.v1', [
      ...upserts.map((c) => ({ key: candidateKey(scope, c.dedupe_key), value: toRecord(c, scope, now) })),
      ...retracts.map((k) => ({ key: candidateKey(scope, k), value: retractedRecord(k, scope, now) })),
    ]);
    if (upserts.length) onPublished('active', upserts.length);
    if (retracts.length) onPublished('retracted', retracts.length);
    const again = await store.release(
      scope,
      token,
      LOCK_TTL_MS,
      upserts.map((c) => [c.dedupe_key, next.get(c.dedupe_key)!]),
      retracts,
    );
    if (!again) return;
    published = next;
    snap = await store.snapshot(scope);
  }
}
