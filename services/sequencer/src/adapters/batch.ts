import type { SequenceStateRecord, ToolCallsEvent } from '../../../../schemas/index.js';
import type { BatchHandler } from '../../../../shared/kafka/runner.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Orchestrations } from '../core/orchestration.js';
import { applyEvent, type IgnoreReason, type SessionState } from '../core/session.js';
import type { SequencerMetrics } from './metrics.js';
import type { PlannedWrite, RedisSessionStore, SessionRef } from './redis/store.js';

const idOf = (e: ToolCallsEvent) => `${e.tenant_id}\u001f${e.agent_id}\u001f${e.session_id}`;

/**
 * One batch: load every session it touches (one round trip), apply the events in order, publish the records,
 * then store the states (one compare-and-set round trip).
 */
export function createBatchHandler(o: {
  config: Orchestrations;
  store: Pick<RedisSessionStore, 'load' | 'plan' | 'save' | 'stored'>;
  sink: Sink;
  topic: string;
  metrics: SequencerMetrics;
  /** Copies the states about to be written (the session topic), before Redis: what survives its loss. */
  copy?: ((writes: Pick<PlannedWrite, 'ref' | 'value'>[]) => Promise<void>) | undefined;
}): BatchHandler<ToolCallsEvent> {
  const { config, store, sink, topic, metrics, copy } = o;
  /**
   * Sessions copied by a batch whose write then failed: their last record on the session topic may be a state
   * Redis never held. After a lost compare-and-set it is even at the version the winner wrote, so a restore after
   * a Redis loss would take it (of two records at one version the later wins, and compaction keeps only the
   * later). The retry does not mend it when the winner applied the same events: they are duplicates then, and
   * nothing is copied. So what Redis holds is copied after it, here or, should that fail, before the next batch.
   */
  const owed = new Map<string, Pick<PlannedWrite, 'ref' | 'value'>>();
  const recopy = async () => {
    const ws = [...owed.values()];
    const keys = [...owed.keys()];
    const now = await store.stored(keys);
    // A write that landed left the copy right; a session gone from Redis has nothing to copy.
    const fixes = ws.flatMap((w, i) =>
      now[i] != null && now[i] !== w.value ? [{ ...w, value: now[i] }] : [],
    );
    if (fixes.length) await copy!(fixes);
    for (const k of keys) owed.delete(k);
  };
  return async (batch) => {
    if (owed.size) await recopy();
    const refs = new Map<string, SessionRef>();
    const ids = batch.map(({ value: e }) => {
      const id = idOf(e);
      if (!refs.has(id)) refs.set(id, { tenant: e.tenant_id, agent: e.agent_id, session: e.session_id });
      return id;
    });
    const loaded = await store.load(refs);
    const current = new Map<string, SessionState>();
    const out: SequenceStateRecord[] = [];
    let duplicates = 0;
    const ignored = new Map<IgnoreReason, number>();
    for (const [i, rec] of batch.entries()) {
      const e = rec.value;
      const id = ids[i]!;
      const prev = current.get(id) ?? loaded.get(id)!.state;
      const r = applyEvent(config.get(e.tenant_id, e.agent_id), prev, e, {
        partition: rec.partition,
        offset: rec.offset,
      });
      if (r.duplicate) {
        duplicates++;
        continue;
      }
      // Left alone: no record, and its session is not written for it (no Redis key, no session-topic record).
      if (r.ignored) {
        ignored.set(r.ignored, (ignored.get(r.ignored) ?? 0) + 1);
        continue;
      }
      current.set(id, r.state);
      if (r.record) out.push(r.record);
    }
    // Publish, then store: a crash in between re-applies the same events, to the same records unless the
    // orchestration changed meanwhile (at-least-once: the stored state decides, never the record).
    await sink.send(
      topic,
      'sequence-state.v1',
      out.map((v) => ({ key: v.session_id, value: v })),
    );
    const writes = store.plan(
      [...current].map(([id, state]) => {
        const { version, key } = loaded.get(id)!;
        return { ref: refs.get(id)!, state, version, key };
      }),
    );
    // The copy after the records and before Redis: a state Redis held is always on the topic (a crash in between
    // re-applies the batch, which writes the same states again). Not sent alongside the records, though it
    // would cost less: a copy that landed while its batch's records did not would, after a crash and a Redis
    // loss, restore states whose events are then skipped as redelivered, and their records never go out.
    await copy?.(writes);
    try {
      await store.save(writes);
    } catch (err) {
      if (copy) {
        for (const w of writes) owed.set(w.key, w);
        // Redis unreachable: the next batch, retried after backoff, copies them first.
        await recopy().catch(() => undefined);
      }
      throw err;
    }
    // Counted once the batch is done, as the states are: a batch that fails is run again whole, and its
    // duplicates were counted once per attempt.
    metrics.duplicates.inc(duplicates);
    for (const [reason, n] of ignored) metrics.ignored.inc({ reason }, n);
    metrics.states.inc(out.length);
    for (const v of out) if (v.violation) metrics.violations.inc({ policy: v.violation.policy });
  };
}
