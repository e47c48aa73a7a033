import { describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { learnStream, prng } from '../learn-streams.js';
import { applyEvent, MemoryLearnStore, taskId, type LearnStore } from '../../src/core/learn/engine.js';
import {
  contextsTouched,
  DEFAULT_LEARN,
  evictionDue,
  evictionDueLoaded,
  newLearnTask,
  newScopeState,
  slotContext,
  type LearnOptions,
  type LearnTask,
  type ScopeState,
} from '../../src/core/learn/learner.js';

/**
 * The service's store loads, per batch, only the contexts `contextsTouched` names (the whole scope only when
 * eviction may run). A context it misses would start empty in that batch and be written back so: the service
 * would learn otherwise than `paver predict`. This replays streams through such a store (pure, in memory) and
 * through the whole-state store, and asks for the same answer at every event.
 */

const clone = <T>(v: T): T => JSON.parse(JSON.stringify(v)) as T;

/** Loads a batch's contexts from `backing` as the Redis store does, applies the batch, writes back what it held. */
class PartialStore implements LearnStore {
  private part: ScopeState = newScopeState();
  /** Batches that read the whole scope, and those the coarse test alone would have made read it. */
  readonly whole = { loads: 0, coarse: 0 };
  constructor(
    private readonly backing: ScopeState,
    private readonly tasks: Map<string, LearnTask>,
  ) {}
  load(batch: ToolCallsEvent[], opts: LearnOptions) {
    const byTask = new Map<string, ToolCallsEvent[]>();
    for (const e of batch) {
      if (e.task_id === undefined) continue;
      const id = taskId(e.tenant_id, e.agent_id, e.task_id);
      byTask.set(id, [...(byTask.get(id) ?? []), e]);
    }
    const wanted = new Set<string>();
    const slots = new Map<string, number>();
    for (const [id, evs] of byTask)
      for (const k of contextsTouched(
        this.tasks.get(id) ?? newLearnTask(),
        evs as never,
        opts,
        undefined,
        slots,
      ))
        wanted.add(k);
    // Scope-wide fields (the clock, the counts, the families) come with every load, as the store's `m` field.
    const { clock, nCtx, nSlots, nActive, fam } = this.backing;
    this.part = { ...newScopeState(), clock, nCtx, nSlots, nActive };
    if (fam) this.part.fam = clone(fam);
    for (const k of wanted) if (this.backing.ctx[k]) this.part.ctx[k] = clone(this.backing.ctx[k]);
    for (const [sk, slot] of Object.entries(this.backing.slots))
      if (wanted.has(slotContext(sk))) this.part.slots[sk] = clone(slot);
    this.loaded = new Set(Object.keys(this.part.ctx));
    // As the store decides: the whole scope only when eviction can run in this batch.
    const events = batch.filter((e) => e.type !== 'user_message' && e.task_id !== undefined).length;
    if (!evictionDue(this.backing, events, opts)) return;
    this.whole.coarse++;
    if (!evictionDueLoaded(this.backing, this.part, wanted, slots, events, opts)) return;
    this.whole.loads++;
    this.part.ctx = clone(this.backing.ctx);
    this.part.slots = clone(this.backing.slots);
    this.loaded = new Set(Object.keys(this.part.ctx));
  }
  /** The contexts the last load read: what eviction may have deleted. */
  private loaded = new Set<string>();
  save() {
    const loaded = this.loaded;
    const { clock, nCtx, nSlots, nActive, fam } = this.part;
    Object.assign(this.backing, { clock, nCtx, nSlots, nActive });
    if (fam) this.backing.fam = clone(fam);
    // What eviction deleted from what was loaded is deleted from the backing state too.
    for (const k of Object.keys(this.backing.ctx))
      if (loaded.has(k) && !this.part.ctx[k]) delete this.backing.ctx[k];
    for (const sk of Object.keys(this.backing.slots))
      if (loaded.has(slotContext(sk)) && !this.part.slots[sk]) delete this.backing.slots[sk];
    for (const [k, c] of Object.entries(this.part.ctx)) this.backing.ctx[k] = clone(c);
    for (const [sk, s] of Object.entries(this.part.slots)) this.backing.slots[sk] = clone(s);
  }

  scope(): ScopeState {
    return this.part;
  }
  task(tenant: string, agent: string, task: string): LearnTask {
    return this.tasks.get(taskId(tenant, agent, task)) ?? newLearnTask();
  }
  setTask(tenant: string, agent: string, task: string, t: LearnTask): void {
    this.tasks.set(taskId(tenant, agent, task), t);
  }
}

describe('learned state loaded in part per batch (as the service does) gives the offline answers', () => {
  for (const [name, opts] of [
    // Bounds no stream reaches: every batch reads only what it touches.
    ['no eviction', { ...DEFAULT_LEARN, maxContexts: 100_000, maxSlots: 100_000 }],
    // Bounds the stream passes many times: batches where eviction can run read the whole scope.
    ['eviction', { ...DEFAULT_LEARN, maxContexts: 16, maxSlots: 24 }],
    // Slots alone at their bound (contexts far from theirs).
    ['eviction', { ...DEFAULT_LEARN, maxContexts: 100_000, maxSlots: 20 }],
    // The same with counts halved every few calls: after a halving a call weighs twice in its context's
    // shares, so a slot comes sooner than the shares before it say.
    ['eviction', { ...DEFAULT_LEARN, maxContexts: 100_000, maxSlots: 20, maxCount: 8 }],
  ] as [string, LearnOptions][])
    for (const seed of [1, 2, 3, 4, 5])
      it(`the same proposal at every event, and the same state at the end (${name} at ${opts.maxContexts} contexts / ${opts.maxSlots} slots / counts halved past ${opts.maxCount}, seed ${seed})`, () => {
        const events = learnStream(seed, 240);
        const whole = new MemoryLearnStore();
        const expected = events.map((e) => JSON.stringify(applyEvent(whole, e, opts)?.next ?? null));

        const backing = newScopeState();
        const partial = new PartialStore(backing, new Map());
        const r = prng(seed + 100);
        const got: string[] = [];
        for (let i = 0; i < events.length;) {
          const batch = events.slice(i, (i += r.int(1, 9)));
          partial.load(batch, opts);
          for (const e of batch) got.push(JSON.stringify(applyEvent(partial, e, opts)?.next ?? null));
          partial.save();
        }
        expect(got).toEqual(expected);
        expect(got.filter((g) => g !== 'null').length).toBeGreaterThan(100);
        const state = whole.scope('default', 'default');
        expect(backing).toEqual(state);
        if (name === 'eviction') {
          // Eviction ran, on whole loads only; the batches that could create nothing the scope lacked read a
          // part, where the test on counts alone would have read the whole scope for every one of them.
          expect(partial.whole.loads).toBeGreaterThan(0);
          expect(partial.whole.loads).toBeLessThan(partial.whole.coarse);
        } else expect(partial.whole.coarse).toBe(0);
      });
});
