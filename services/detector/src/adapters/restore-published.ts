import { flowCandidateRecordV1 } from '../../../../schemas/index.js';
import type { Codec } from '../../../../shared/codec.js';
import { readToEnd, type ReplayOptions } from '../../../../shared/kafka/replay.js';
import type { Logger } from '../../../../shared/log.js';
import { candidateKey } from '../core/candidate.js';
import { scopeId, type Scope } from '../core/ops.js';
import type { RedisDetectorStore } from './redis/store.js';

export interface RestorePublishedDeps {
  /** The flow-candidates topic's replay reader. */
  candidates: ReplayOptions;
  codec: Codec;
  store: Pick<RedisDetectorStore, 'restorePublished'>;
  /** DETECTOR_SCOPE_TTL_MS. */
  scopeTtlMs: number;
  log: Logger;
}

/**
 * The publication maps after a Redis loss, put back from the candidates the topic still holds as active, per
 * scope (the latest record per key wins). Returns the scopes it touched.
 */
export function createRestorePublished(d: RestorePublishedDeps): () => Promise<Scope[]> {
  return async () => {
    const latest = new Map<string, { scope: Scope; key: string; active: boolean; at: number }>();
    // Each scope's latest stamp on the topic: flows holds records stamped so, and drops an older one as stale.
    const stamps = new Map<string, { scope: Scope; at: number }>();
    await readToEnd(d.candidates, async (_p, messages) => {
      for (const m of messages) {
        if (m.value === null) continue;
        const rec = await d.codec.decode(m.value).then(
          (v) => flowCandidateRecordV1.safeParse(v),
          () => null,
        );
        if (!rec?.success) continue;
        const scope = { tenant: rec.data.tenant_id, agent: rec.data.agent_id };
        const sid = scopeId(scope);
        stamps.set(sid, { scope, at: Math.max(stamps.get(sid)?.at ?? 0, rec.data.detected_at) });
        // The newest by stamp, whatever the order partitions are read in: one candidate's records may sit
        // under two keys (a key format changed between versions), on two partitions.
        const k = candidateKey(scope, rec.data.dedupe_key);
        const prev = latest.get(k);
        if (prev && prev.at > rec.data.detected_at) continue;
        latest.set(k, {
          scope,
          key: rec.data.dedupe_key,
          active: rec.data.status === 'active',
          at: rec.data.detected_at,
        });
      }
    });
    const byScope = new Map<string, { scope: Scope; keys: string[] }>();
    for (const c of latest.values()) {
      if (!c.active) continue;
      const id = scopeId(c.scope);
      let g = byScope.get(id);
      if (!g) byScope.set(id, (g = { scope: c.scope, keys: [] }));
      g.keys.push(c.key);
    }
    // Retired scopes keep their retractions on the topic: their stamps come back expiring, as retirement left them.
    await d.store.restorePublished([...byScope.values()], [...stamps.values()], d.scopeTtlMs);
    d.log.info({ scopes: byScope.size }, 'publication state restored from the flow-candidates topic');
    return [...byScope.values()].map((g) => g.scope);
  };
}
