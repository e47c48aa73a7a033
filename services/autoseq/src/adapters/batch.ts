import type { NextActionRecord, ToolCallsEvent } from '../../../../schemas/index.js';
import { sha256 } from '../../../../shared/hash.js';
import type { BatchContext, BatchHandler } from '../../../../shared/kafka/runner.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Catalog } from '../core/catalog.js';
import {
  decide,
  newTaskState,
  withoutArguments,
  type AutoseqOptions,
  type TaskState,
} from '../core/decide.js';
import { applyEvent, scopeId, typedProposal } from '../core/learn/engine.js';
import type { ArgsValidator, LearnOptions } from '../core/learn/learner.js';
import { learnedExecutable, learnedRecord, messageRecord } from '../core/learn/record.js';
import type { Position } from '../core/position.js';
import { payloadShape } from '../core/shape.js';
import type { AutoseqMetrics } from './metrics.js';
import type { ContextsWritten, RedisLearnStore } from './redis/learn-store.js';
import type { RedisTaskStore, TaskRef } from './redis/task-store.js';

const idOf = (e: { tenant_id: string; agent_id: string; task_id?: string | undefined }) =>
  `${e.tenant_id}\u001f${e.agent_id}\u001f${e.task_id}`;

/**
 * A payload fingerprint hashes a payload's type and key names, which repeat from event to event (twice per
 * event when a learned record replaces the typed one): the digests of recent texts are kept (bounded).
 */
function memoHash(hash: (text: string) => string, max = 4096): (text: string) => string {
  const cache = new Map<string, string>();
  return (text) => {
    let h = cache.get(text);
    if (h === undefined) {
      if (cache.size >= max) cache.clear();
      cache.set(text, (h = hash(text)));
    }
    return h;
  };
}

/**
 * One batch: load the typed task states (and, with learning on, the learned state), decide every tool call
 * typed then learned, publish the records, then store the states.
 */
export function createBatchHandler(o: {
  catalog: Catalog;
  store: Pick<RedisTaskStore, 'load' | 'save'>;
  /** Null when learning is off: typed state alone is stored. */
  loadLearn:
    ((events: ToolCallsEvent[], ctx: BatchContext, positions: Position[]) => Promise<RedisLearnStore>) | null;
  taskKey: (ref: TaskRef) => string;
  opts: AutoseqOptions;
  lopts: LearnOptions;
  sink: Sink;
  topic: string;
  metrics: AutoseqMetrics;
  /** Told the contexts each learned save wrote (the rules topic's copy follows them). */
  onLearned?: ((written: readonly ContextsWritten[]) => void) | undefined;
}): BatchHandler<ToolCallsEvent> {
  const { catalog, store, loadLearn, taskKey, opts, lopts, sink, topic, metrics: m } = o;
  const hash = memoHash(sha256);
  const validate: ArgsValidator = (who, tool, args) => {
    const t = catalog.scope(who.tenant_id, who.agent_id)?.tools.get(tool);
    return t ? t.validate(args) : undefined;
  };
  return async (batch, ctx) => {
    const refs = new Map<string, TaskRef>();
    const learnEvents: ToolCallsEvent[] = [];
    const learnPositions: Position[] = [];
    for (const { value: e, partition, offset } of batch) {
      if (e.task_id !== undefined) {
        // A later user message may publish a learned proposal too, gated by the task's typed state.
        if (e.type === 'tool_call' || e.type === 'user_message')
          refs.set(idOf(e), { tenant: e.tenant_id, agent: e.agent_id, task: e.task_id });
        learnEvents.push(e);
        learnPositions.push({ partition, offset });
      }
    }
    if (learnEvents.length === 0) return;
    // The typed states are read once the scopes' leases are held: a batch that waited reads them fresh.
    const learn = loadLearn ? await loadLearn(learnEvents, ctx, learnPositions) : null;
    try {
      const states = await store.load(refs);
      await decideAndStore(batch, refs, states, learn);
    } catch (err) {
      // The scopes' leases go back at once: a retry of this batch (or another instance) need not wait them out.
      await learn?.release().catch(() => undefined);
      throw err;
    }
  };

  async function decideAndStore(
    batch: Parameters<BatchHandler<ToolCallsEvent>>[0],
    refs: Map<string, TaskRef>,
    states: Map<string, TaskState>,
    learn: RedisLearnStore | null,
  ): Promise<void> {
    const dirty = new Map<string, { ref: TaskRef; state: TaskState }>();
    const out: NextActionRecord[] = [];
    const scored: { held: boolean; origin: string; state: string; hit: boolean; executed: boolean }[] = [];
    const moved: string[] = [];
    // Counted once the batch is done, as the states are: a batch that fails and runs again counted its
    // redelivered events once per attempt.
    let duplicates = 0;
    for (const { value: e, partition, offset } of batch) {
      const pos = { partition, offset };
      if (e.type !== 'tool_call') {
        const lr = learn ? applyEvent(learn, e, lopts, validate, null, pos) : null;
        if (lr?.held)
          scored.push({
            held: true,
            origin: lr.held.origin,
            state: lr.held.state,
            hit: false,
            executed: false,
          });
        for (const t of lr?.transitions ?? []) moved.push(t.to);
        // Proposed again after a later user message: the record replaces the one of the task's last call.
        if (e.type === 'user_message' && e.task_id !== undefined && lr) {
          const id = idOf(e);
          let task = states.get(id) ?? newTaskState();
          let execute = false;
          // Gated by the task's last call (kept in its typed state), as the record it replaces was.
          if (lr.next)
            ({ execute, task } = learnedExecutable(e, task.prev, lr.next, catalog, task, opts, hash, true));
          out.push(messageRecord({ ...e, task_id: e.task_id }, lr.task.step ?? 0, lr.next, execute));
          states.set(id, task);
          dirty.set(id, { ref: refs.get(id)!, state: task });
        }
        continue;
      }
      const id = idOf(e);
      const end = m.decisionSeconds.startTimer();
      const d = decide(e, catalog, states.get(id) ?? newTaskState(), opts, hash, pos);
      if (d.duplicate) {
        end();
        duplicates++;
        continue;
      }
      const typedNext = typedProposal(d.records, e.observation);
      const lr = learn ? applyEvent(learn, e, lopts, validate, typedNext, pos) : null;
      let task = d.task;
      // decide() built these records for this event alone: marking them in place changes nothing else.
      let records = d.records;
      for (const rec of records) if (rec.event_type === 'auto_seq_detected_unique') rec.origin = 'typed';
      if (!typedNext && lr?.next) {
        // A learned proposal replaces the typed "none/ambiguous/skipped" record for this event.
        const gate = learnedExecutable(e, task.prev, lr.next, catalog, task, opts, hash);
        task = gate.task;
        records = [
          ...records.filter((rec) => rec.event_type === 'auto_seq_executed'),
          learnedRecord(e, payloadShape(e.observation, hash), lr.next, gate.execute),
        ];
      }
      end();
      if (lr?.held)
        scored.push({
          held: true,
          origin: lr.held.origin,
          state: lr.held.state,
          hit: lr.heldHit === true,
          executed: records.some((rec) => rec.event_type === 'auto_seq_executed'),
        });
      else if (records.some((rec) => rec.event_type === 'auto_seq_executed'))
        scored.push({ held: false, origin: 'typed', state: 'active', hit: false, executed: true });
      for (const t of lr?.transitions ?? []) moved.push(t.to);
      states.set(id, task);
      dirty.set(id, { ref: refs.get(id)!, state: task });
      out.push(...records);
    }
    // Publish first, then store: a crash in between re-decides the same events to the same records (unless the
    // catalog changed meanwhile). A batch
    // (or a send) that ran long renews its leases before and after, so its write is not refused.
    await learn?.leases.keepFresh();
    await sink.send(
      topic,
      'next-actions.v1',
      out.map((rec) => ({ key: rec.session_id, value: rec })),
      withoutArguments,
    );
    if (learn) {
      await learn.leases.keepFresh();
      // Typed and learned state in one script call per scope: a crash never keeps one without the other.
      try {
        await learn.save(
          [...dirty.values()].map(({ ref, state }) => ({
            tenant: ref.tenant,
            agent: ref.agent,
            key: taskKey(ref),
            value: JSON.stringify(state),
          })),
        );
      } finally {
        // What the save wrote, or may have written before it failed, is copied all the same.
        o.onLearned?.(learn.written());
      }
      // Only scopes with active rules take an entry: scope ids come from producers (a run id in agent_id makes
      // every run a scope), and an entry of 0 per scope ever seen grew for the life of the process.
      for (const s of learn.scopeStates()) {
        const id = scopeId(s.tenant, s.agent);
        if (s.state.nActive > 0) m.activeByScope.set(id, s.state.nActive);
        else m.activeByScope.delete(id);
      }
    } else await store.save(dirty);
    if (duplicates > 0) m.duplicates.inc(duplicates);
    for (const rec of out) m.decisions.inc({ event_type: rec.event_type, reason: rec.reason ?? '' });
    for (const sc of scored) {
      if (sc.held) m.proposals.inc({ origin: sc.origin, state: sc.state, outcome: sc.hit ? 'hit' : 'miss' });
      if (sc.executed || (sc.hit && sc.state === 'active')) m.saved.inc();
    }
    for (const to of moved) m.transitions.inc({ to });
  }
}
