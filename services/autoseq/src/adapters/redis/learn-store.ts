import { setOwn } from '../../../../../shared/core/own.js';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import type {
  TaskCompletedEvent,
  ToolCallEvent,
  ToolCallsEvent,
  UserMessageEvent,
} from '../../../../../schemas/index.js';
import { stateLostMidRead, type EpochMarker } from '../../../../../shared/redis/epoch.js';
import { execPipeline } from '../../../../../shared/redis/replies.js';
import { invokeScript, parseScriptReply } from '../../../../../shared/redis/scripts.js';
import { escapeKeyPart, globLiteral, scopeTag, unescapeKeyPart } from '../../../../../shared/redis/keys.js';
import {
  contextsTouched,
  evictionDue,
  evictionDueLoaded,
  newLearnTask,
  newScopeState,
  slotContext,
  slotKey,
  type CtxStat,
  type LearnOptions,
  type LearnTask,
  type ScopeState,
  type Slot,
} from '../../core/learn/learner.js';
import { scopeId, taskId, type LearnStore } from '../../core/learn/engine.js';
import type { Position } from '../../core/position.js';
import { defineScopeScripts, LEASE_LOST_CODES, ScopeLeases, type LeaseOptions } from './scope-lease.js';

/**
 * `<prefix>:aseq:{tenant|agent}:rules`: the scope's learned state as a hash, one field per context (its
 * next-tool counts and its slots, with their rules) and a field `m` for the clock and the counts. A batch
 * reads and writes only the contexts its events touch, so the cost per batch does not grow with what the
 * scope has learned.
 */
export const learnKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:rules`;
/** `<prefix>:aseq:{tenant|agent}:retiring`: names of a retired scope's contexts not yet tombstoned (scope-retire.ts). */
export const retiringKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:retiring`;
/**
 * `<prefix>:aseq:{tenant|agent}:fence`: context names of a stale copy whose fence's send failed, left for the sweep
 * (scope-retire.ts). Unlike a retiring set, the restore ignores it, so one written just before a Redis loss keeps no
 * lost scope from being written back; it tells the sweep which records to tombstone beside the scope record, and
 * that a retirement or a forget, not Redis's expiry, took the scope's state.
 */
export const fenceKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:fence`;
/**
 * `<prefix>:aseq:{tenant|agent}:forgets`: how many times the scope was forgotten (`POST /rules/forget`), its forget
 * generation. No TTL: it outlives the scope's state, and each copy records it, so that a copy read before a forget
 * reads as older than that forget's marker on the rules topic. After a Redis loss, the restore writes it back
 * from the topic before anything else can read it (`raiseForgets`).
 */
export const forgetsKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:forgets`;
/** `<prefix>:aseq:{tenant|agent}:ltask:<task_id>`: a task's recent calls, user text and pending proposals. */
export const learnTaskKey = (prefix: string, tenant: string, agent: string, task: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:ltask:${escapeKeyPart(task)}`;

const META = 'm';
const ctxField = (ctx: string) => `c:${ctx}`;

/** A scope's families (`ScopeState.fam`), as `m` and the rules topic's scope record hold them. */
export const familiesShape = z.record(z.string(), z.tuple([z.number(), z.number(), z.number(), z.number()]));

// Shallow checks: the state is ours (written by this code); a mismatch (another version) starts afresh.
const metaShape = z.object({
  v: z.literal(2),
  clock: z.number(),
  nCtx: z.number(),
  nSlots: z.number(),
  nActive: z.number(),
  fam: familiesShape.optional(),
});
type Meta = z.infer<typeof metaShape>;
/** The scope-wide fields (the `m` value) of a state. */
const metaOfState = (s: ScopeState): Meta => {
  const { clock, nCtx, nSlots, nActive, fam } = s;
  return fam ? { v: 2, clock, nCtx, nSlots, nActive, fam } : { v: 2, clock, nCtx, nSlots, nActive };
};
const ctxShape = z.object({
  c: z.object({ n: z.number() }).passthrough(),
  s: z.record(z.string(), z.unknown()),
});
const saveReply = z.tuple([z.literal(1)]);
const taskShape = z.object({
  seen: z.array(z.string()),
  at: z.object({ partition: z.number().int().nonnegative(), offset: z.string().regex(/^\d+$/) }).optional(),
  calls: z.array(z.object({ tool: z.string() }).passthrough()),
  user: z.string().nullable(),
  said: z.string().optional(),
  step: z.number().int().nonnegative().optional(),
  pending: z.array(z.unknown()),
  best: z.unknown(),
  ended: z.literal(true).optional(),
});

const parseJson = (v: unknown): unknown => {
  if (typeof v !== 'string') return null;
  try {
    return JSON.parse(v) as unknown;
  } catch {
    return null;
  }
};

/** A context field's value: the context's counts and its slots by next tool. */
interface CtxGroup {
  c: CtxStat;
  s: Record<string, Slot>;
}

/** Reads one context field into `state`; its number of slots, or -1 when the value is not ours. */
function readGroup(state: ScopeState, ctx: string, raw: unknown): number {
  const v = parseJson(raw);
  if (v === null || !ctxShape.safeParse(v).success) return -1;
  const g = v as CtxGroup;
  // Keyed by tool names (a context of one tool, a slot's tool): own properties, whatever the name.
  setOwn(state.ctx, ctx, g.c);
  let slots = 0;
  for (const [tool, slot] of Object.entries(g.s)) {
    state.slots[slotKey(ctx, tool)] = slot;
    slots++;
  }
  return slots;
}

/** The scope's context groups (slots grouped under their context), by context. */
function contextGroups(state: ScopeState): Map<string, CtxGroup & { slots: number }> {
  const groups = new Map<string, CtxGroup & { slots: number }>();
  for (const [ctx, c] of Object.entries(state.ctx)) groups.set(ctx, { c, s: {}, slots: 0 });
  for (const [sk, slot] of Object.entries(state.slots)) {
    const g = groups.get(slotContext(sk));
    if (g) {
      setOwn(g.s, slot.tool, slot);
      g.slots++;
    }
  }
  return groups;
}

interface LoadedScope {
  tenant: string;
  agent: string;
  state: ScopeState;
  /** Field → value as read, to write back only what changed and delete what was evicted. */
  read: Map<string, string>;
  /** Field → its number of slots as read. */
  readSlots: Map<string, number>;
  /**
   * Contexts the batch's events can change (the core's `contextsTouched`). Any other context read (the whole
   * scope is read when eviction may run) can only lose slots to eviction, or go whole: one whose slot count
   * is as read is unchanged, and is not serialised again to find that out.
   */
  touched: Set<string>;
}

/** The scope-wide fields of a stored `m` (named one by one: the stored object is not copied whole). */
function assignMeta(state: ScopeState, meta: Meta): void {
  state.clock = meta.clock;
  state.nCtx = meta.nCtx;
  state.nSlots = meta.nSlots;
  state.nActive = meta.nActive;
  if (meta.fam) state.fam = meta.fam;
}

/** A scope as a batch starts it: its counts (from `m`) and no context yet. */
function loadedScope(tenant: string, agent: string, meta: Meta | null, touched?: Set<string>): LoadedScope {
  const state = newScopeState();
  if (meta) assignMeta(state, meta);
  return { tenant, agent, state, read: new Map(), readSlots: new Map(), touched: touched ?? new Set() };
}

/** Reads one stored context field into the scope, remembering it as read (what `save` compares against). */
function readField(sc: LoadedScope, field: string, raw: unknown): void {
  if (typeof raw !== 'string' || !field.startsWith('c:')) return;
  const slots = readGroup(sc.state, field.slice(2), raw);
  if (slots < 0) return;
  sc.read.set(field, raw);
  sc.readSlots.set(field, slots);
}

type ScopeEvent = ToolCallEvent | TaskCompletedEvent | UserMessageEvent;

/** A task state written with the learned state of its scope (the typed decider's, beside the learned one). */
export interface TaskWrite {
  tenant: string;
  agent: string;
  key: string;
  value: string;
}

/**
 * A batch's learned state, in two pipelined round trips: the leases of its scopes, the tasks and each scope's
 * counts, then the contexts the batch's events can touch; and a third, the whole scope, only when eviction can
 * run in this batch (the counts plus what the batch can create, the touched contexts and slots the scope does
 * not hold yet, pass a bound). Written back with one script call per scope (`learnSave-n.lua`): changed context fields, deleted
 * (evicted) ones, the counts, and the scope's task values, only while the batch still holds the scope's
 * lease, so a crash never leaves one without the others and no other batch's learning is overwritten.
 * Task values expire after the task TTL; scope values are bounded by the core's limits instead.
 */
export class RedisLearnStore implements LearnStore {
  private readonly scopes = new Map<string, LoadedScope>();
  private readonly tasks = new Map<
    string,
    { ref: { tenant: string; agent: string; task: string }; state: LearnTask }
  >();
  private readonly dirtyTasks = new Set<string>();
  /** Per scope `save` wrote: the contexts it set or deleted (what the rules topic must copy). */
  private readonly wrote: ContextsWritten[] = [];

  private constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly taskTtlMs: number,
    readonly leases: ScopeLeases,
    /** A scope's rules expire this long after the last batch that wrote them (0: never). */
    private readonly scopeTtlMs: number,
  ) {}

  /**
   * `events`: the batch's events that carry a task id, in batch order, each at `positions[i]` in Kafka when
   * given (what tells a redelivered event). Holds the leases of their scopes until `save` (or `release`, which
   * the caller owes on any failure in between).
   */
  static async load(
    redis: Redis,
    prefix: string,
    taskTtlMs: number,
    opts: LearnOptions,
    events: readonly ToolCallsEvent[],
    lease: LeaseOptions,
    positions?: readonly Position[],
    marker?: EpochMarker,
    /** AUTOSEQ_LEARN_SCOPE_TTL_MS (0: the rules never expire). */
    scopeTtlMs = 0,
  ): Promise<RedisLearnStore> {
    defineScopeScripts(redis);
    const s = new RedisLearnStore(
      redis,
      prefix,
      taskTtlMs,
      new ScopeLeases(redis, prefix, lease),
      scopeTtlMs,
    );
    try {
      await s.read(opts, events, positions, marker);
    } catch (err) {
      await s.leases.release().catch(() => undefined);
      throw err;
    }
    return s;
  }

  private async read(
    opts: LearnOptions,
    events: readonly ToolCallsEvent[],
    positions?: readonly Position[],
    marker?: EpochMarker,
  ): Promise<void> {
    const { redis, prefix } = this;
    const scopeRefs = new Map<string, { tenant: string; agent: string; events: number }>();
    const taskRefs = new Map<
      string,
      {
        tenant: string;
        agent: string;
        task: string;
        events: ScopeEvent[];
        positions: (Position | undefined)[];
      }
    >();
    for (const [i, e] of events.entries()) {
      if (e.task_id === undefined) continue;
      const sid = scopeId(e.tenant_id, e.agent_id);
      const sr = scopeRefs.get(sid) ?? { tenant: e.tenant_id, agent: e.agent_id, events: 0 };
      scopeRefs.set(sid, sr);
      const tid = taskId(e.tenant_id, e.agent_id, e.task_id);
      const tr = taskRefs.get(tid) ?? {
        tenant: e.tenant_id,
        agent: e.agent_id,
        task: e.task_id,
        events: [],
        positions: [],
      };
      taskRefs.set(tid, tr);
      // A user message changes no count, but it refines the contexts the task's later calls touch.
      if (e.type !== 'user_message') sr.events++;
      tr.events.push(e);
      tr.positions.push(positions?.[i]);
    }
    const scopes = [...scopeRefs].map(([id, r]) => ({ id, tenant: r.tenant, agent: r.agent }));
    const reads = (pipe: ReturnType<Redis['pipeline']>) => {
      for (const r of scopeRefs.values()) pipe.hget(learnKey(prefix, r.tenant, r.agent), META);
      for (const r of taskRefs.values()) pipe.get(learnTaskKey(prefix, r.tenant, r.agent, r.task));
      // Last, after the reads: a state lost before or while they ran has taken the marker with it.
      if (marker?.value) pipe.get(marker.key);
      return pipe;
    };
    // The leases ride the first read's round trip; a scope another batch holds is waited for, then read.
    const first = redis.pipeline();
    const took = this.leases.tryAll(first, scopes);
    reads(first);
    let replies = await execPipeline(first, 'learned state read');
    if (took(replies.slice(0, scopes.length))) replies = replies.slice(scopes.length);
    else {
      await this.leases.acquire(scopes);
      replies = await execPipeline(reads(redis.pipeline()), 'learned state read');
    }
    if (marker?.value && replies.at(-1) !== marker.value) throw stateLostMidRead();
    let i = 0;
    const metas = new Map<string, Meta | null>();
    for (const id of scopeRefs.keys()) {
      const m = parseJson(replies[i++]);
      metas.set(id, m !== null && metaShape.safeParse(m).success ? (m as Meta) : null);
    }
    for (const [id, r] of taskRefs) {
      const v = parseJson(replies[i++]);
      this.tasks.set(id, {
        ref: r,
        state: v !== null && taskShape.safeParse(v).success ? (v as LearnTask) : newLearnTask(),
      });
    }

    // Which contexts each scope's events can touch, from the tasks as read, and which slots they can create.
    const wanted = new Map<string, Set<string>>();
    const newSlots = new Map<string, Map<string, number>>();
    for (const [id, r] of taskRefs) {
      const sid = scopeId(r.tenant, r.agent);
      const set = wanted.get(sid) ?? new Set<string>();
      wanted.set(sid, set);
      const slots = newSlots.get(sid) ?? new Map<string, number>();
      newSlots.set(sid, slots);
      for (const k of contextsTouched(this.tasks.get(id)!.state, r.events, opts, r.positions, slots))
        set.add(k);
    }
    const second = redis.pipeline();
    // `check`: the counts leave too little room for the batch's events at worst; whether they do at all is
    // known once the touched contexts are read (what the batch can create is what they do not hold).
    const plan: { id: string; fields: string[]; check: boolean }[] = [];
    for (const [id, r] of scopeRefs) {
      const meta = metas.get(id) ?? null;
      this.scopes.set(id, loadedScope(r.tenant, r.agent, meta, wanted.get(id)));
      if (!meta) continue; // a new (or unreadable) scope starts empty
      // No context touched: none created either, so no eviction (the counts are within bounds after a batch).
      const fields = [...(wanted.get(id) ?? [])].map(ctxField);
      if (fields.length === 0) continue;
      second.hmget(learnKey(prefix, r.tenant, r.agent), ...fields);
      plan.push({ id, fields, check: evictionDue(meta, r.events, opts) });
    }
    if (plan.length === 0) return;
    const got = await execPipeline(second, 'learned contexts read');
    const whole: { id: string; meta: Meta }[] = [];
    plan.forEach((p, j) => {
      const sc = this.scopes.get(p.id)!;
      const vals = got[j] as unknown[];
      for (const [k, f] of p.fields.entries()) readField(sc, f, vals[k]);
      const meta = metas.get(p.id)!;
      if (
        p.check &&
        evictionDueLoaded(
          meta,
          sc.state,
          wanted.get(p.id) ?? [],
          newSlots.get(p.id) ?? new Map(),
          scopeRefs.get(p.id)!.events,
          opts,
        )
      )
        whole.push({ id: p.id, meta });
    });
    if (whole.length === 0) return;
    // Eviction can run in this batch: it needs the whole scope (least recently used first, over everything).
    const third = redis.pipeline();
    for (const w of whole) {
      const sc = this.scopes.get(w.id)!;
      third.hgetall(learnKey(prefix, sc.tenant, sc.agent));
    }
    const all = await execPipeline(third, 'learned scope read');
    whole.forEach((w, j) => {
      const was = this.scopes.get(w.id)!;
      const sc = loadedScope(was.tenant, was.agent, w.meta, was.touched);
      this.scopes.set(w.id, sc);
      for (const [f, raw] of Object.entries((all[j] ?? {}) as Record<string, string>))
        if (f !== META) readField(sc, f, raw);
    });
  }

  /** Gives the batch's leases back unwritten: owed by a caller whose batch failed between `load` and `save`. */
  release(): Promise<void> {
    return this.leases.release();
  }

  scope(tenant: string, agent: string): ScopeState {
    const id = scopeId(tenant, agent);
    let s = this.scopes.get(id);
    if (!s) this.scopes.set(id, (s = loadedScope(tenant, agent, null)));
    return s.state;
  }
  task(tenant: string, agent: string, task: string): LearnTask {
    return this.tasks.get(taskId(tenant, agent, task))?.state ?? newLearnTask();
  }
  setTask(tenant: string, agent: string, task: string, t: LearnTask): void {
    const id = taskId(tenant, agent, task);
    this.tasks.set(id, { ref: { tenant, agent, task }, state: t });
    this.dirtyTasks.add(id);
  }
  scopeStates(): { tenant: string; agent: string; state: ScopeState }[] {
    return [...this.scopes.values()];
  }

  /**
   * `extra`: other per-task values written with the same TTL by the same call (each in its scope's). Throws a
   * retriable STATE_CONTENDED when a scope's lease was lost: that scope wrote nothing (others may have).
   */
  async save(extra: TaskWrite[] = []): Promise<void> {
    const writes = new Map<string, { keys: string[]; values: string[] }>();
    const taskWrite = (tenant: string, agent: string, key: string, value: string) => {
      const id = scopeId(tenant, agent);
      const w = writes.get(id);
      if (!w) throw new Error(`task state of a scope this batch did not load: ${id}`);
      w.keys.push(key);
      w.values.push(value);
    };
    for (const [id] of this.scopes) writes.set(id, { keys: [], values: [] });
    for (const t of extra) taskWrite(t.tenant, t.agent, t.key, t.value);
    for (const id of this.dirtyTasks) {
      const t = this.tasks.get(id)!;
      taskWrite(
        t.ref.tenant,
        t.ref.agent,
        learnTaskKey(this.prefix, t.ref.tenant, t.ref.agent, t.ref.task),
        JSON.stringify(t.state),
      );
    }
    const pipe = this.redis.pipeline();
    const wrote: ContextsWritten[] = [];
    for (const [id, sc] of this.scopes) {
      const key = learnKey(this.prefix, sc.tenant, sc.agent);
      const fields = new Set<string>();
      const changed: string[] = [META, JSON.stringify(metaOfState(sc.state))];
      for (const [ctx, g] of contextGroups(sc.state)) {
        const f = ctxField(ctx);
        fields.add(f);
        const was = sc.read.get(f);
        if (was !== undefined && !sc.touched.has(ctx) && sc.readSlots.get(f) === g.slots) continue;
        const v = JSON.stringify({ c: g.c, s: g.s });
        if (was !== v) changed.push(f, v);
      }
      const gone = [...sc.read.keys()].filter((f) => !fields.has(f));
      wrote.push({
        tenant: sc.tenant,
        agent: sc.agent,
        ctxs: [...changed.filter((_, j) => j % 2 === 0 && j > 0), ...gone].map((f) => f.slice(2)),
      });
      const w = writes.get(id)!;
      invokeScript(
        pipe,
        'learnSave',
        [this.leases.leaseKey(sc), key, ...w.keys],
        [
          this.leases.token,
          this.taskTtlMs,
          this.scopeTtlMs,
          changed.length / 2,
          ...changed,
          gone.length,
          ...gone,
          ...w.values,
        ],
      );
    }
    // Marked before the write: a write whose reply is lost (the connection dropped after Redis ran it) is then
    // copied all the same; a scope whose write was refused costs one needless copy of unchanged contexts.
    for (const w of wrote) if (w.ctxs.length > 0) this.wrote.push(w);
    const replies = await execPipeline(pipe, 'learned state write');
    this.leases.released();
    for (const r of replies) parseScriptReply('learnSave', r, saveReply, LEASE_LOST_CODES);
  }

  /** The contexts each scope's `save` set or deleted (or tried to). */
  written(): readonly ContextsWritten[] {
    return this.wrote;
  }
}

/** Contexts of one scope whose stored value changed (set or deleted). */
export interface ContextsWritten {
  tenant: string;
  agent: string;
  ctxs: string[];
}

/** One scope's copy for the rules topic: its counts (`m`) and the named contexts (null: deleted, evicted). */
export interface ScopeCopy {
  tenant: string;
  agent: string;
  /** The `m` field as stored; null when the scope has no state (lost, or never written). */
  meta: string | null;
  /** The scope's forget generation (`forgetsKey`), read before its state. */
  forgets: number;
  ctxs: Map<string, string | null>;
}

/**
 * Reads the named contexts of each scope, with its `m` field and its forget generation, in one round trip. The
 * caller holds the scopes' leases, so each scope reads as one batch left it. The generation is read first: a
 * forget that takes the lease of a copier stalled past it can run between two commands of this pipeline, and
 * then the state read after it is gone (nothing copied) or the generation read before it is the old one (the
 * copy reads as older than the forget). Read after the state, it could be the new one beside the old state.
 */
export async function readContexts(
  redis: Redis,
  prefix: string,
  scopes: readonly ContextsWritten[],
): Promise<ScopeCopy[]> {
  const pipe = redis.pipeline();
  for (const s of scopes) {
    const key = learnKey(prefix, s.tenant, s.agent);
    pipe.get(forgetsKey(prefix, s.tenant, s.agent));
    pipe.hget(key, META);
    // A mark with no context (a scope record to copy again) reads none: HMGET takes at least one field.
    if (s.ctxs.length > 0) pipe.hmget(key, ...s.ctxs.map(ctxField));
    else pipe.exists(key);
  }
  const replies = await execPipeline(pipe, 'learned contexts copy');
  return scopes.map((s, i) => {
    const forgets = generationOf(replies[3 * i]);
    const meta = replies[3 * i + 1];
    const vals = s.ctxs.length > 0 ? (replies[3 * i + 2] as (string | null)[]) : [];
    return {
      tenant: s.tenant,
      agent: s.agent,
      meta: typeof meta === 'string' ? meta : null,
      forgets,
      ctxs: new Map(s.ctxs.map((c, j) => [c, vals[j] ?? null])),
    };
  });
}

/** A `forgets` value as Redis returns it (GET, or a script's integer): 0 when missing. */
export function generationOf(reply: unknown): number {
  const n = typeof reply === 'string' || typeof reply === 'number' ? Number(reply) : 0;
  return Number.isSafeInteger(n) && n > 0 ? n : 0;
}

/**
 * After a Redis loss, each scope's forget generation written back from the topic (its marker's, or a later
 * copy's), where Redis holds less (`forgetFloor-1.lua`): later forgets count on from it, so a forget run on the
 * new Redis writes a marker above every copy read on the old one. A generation of 0 writes nothing and reads
 * what Redis holds. Returns the scopes whose generation this call raised (not one another instance's restore
 * wrote first), and each scope's generation as Redis holds it now (above the topic's where Redis kept a forget
 * whose marker the topic lacks: not sent, or replaced by a lower one that landed last).
 */
export async function raiseForgets(
  redis: Redis,
  prefix: string,
  generations: readonly { tenant: string; agent: string; forgets: number }[],
): Promise<{ raised: Set<string>; held: Map<string, number> }> {
  defineScopeScripts(redis);
  const raised = new Set<string>();
  const held = new Map<string, number>();
  for (let i = 0; i < generations.length; i += 500) {
    const page = generations.slice(i, i + 500);
    const pipe = redis.pipeline();
    for (const g of page)
      invokeScript(pipe, 'forgetFloor', [forgetsKey(prefix, g.tenant, g.agent)], [g.forgets]);
    const replies = await execPipeline(pipe, 'forget generations restore');
    page.forEach((g, j) => {
      const [up, now] = parseScriptReply('forgetFloor', replies[j], floorReply);
      const id = scopeId(g.tenant, g.agent);
      if (up === 1) raised.add(id);
      if (now > 0) held.set(id, now);
    });
  }
  return { raised, held };
}
const floorReply = z.tuple([z.union([z.literal(0), z.literal(1)]), z.number().int().nonnegative()]);

/**
 * Writes a scope's copy back when the scope has no state and is not being retired (`learnRestore-2.lua`). The counts are those of the
 * contexts copied (a context left out of the copy is not counted); the clock is the copy's, or the latest
 * context's use when later. False when the scope had state already (it is newer than the copy).
 */
export async function restoreScope(
  redis: Redis,
  prefix: string,
  tenant: string,
  agent: string,
  clock: number,
  ctxs: ReadonlyMap<string, string>,
  fam?: ScopeState['fam'],
  /** What is left of the scope's idle lifetime (0: it never expires). */
  ttlMs = 0,
): Promise<{ written: boolean; contexts: number }> {
  defineScopeScripts(redis);
  const state = newScopeState();
  state.clock = clock;
  if (fam) state.fam = fam;
  const pairs: string[] = [];
  for (const [ctx, raw] of ctxs) {
    const slots = readGroup(state, ctx, raw);
    if (slots < 0) continue;
    pairs.push(ctxField(ctx), raw);
  }
  let { clock: at } = state;
  for (const c of Object.values(state.ctx)) at = Math.max(at, c.at);
  let nActive = 0;
  for (const s of Object.values(state.slots)) {
    at = Math.max(at, s.at);
    if (s.rule?.state === 'active') nActive++;
  }
  state.clock = at;
  state.nCtx = Object.keys(state.ctx).length;
  state.nSlots = Object.keys(state.slots).length;
  state.nActive = nActive;
  const meta = metaOfState(state);
  const pipe = redis.pipeline();
  invokeScript(
    pipe,
    'learnRestore',
    [learnKey(prefix, tenant, agent), retiringKey(prefix, tenant, agent)],
    [JSON.stringify(meta), ttlMs, ...pairs],
  );
  const [reply] = await execPipeline(pipe, 'learned state restore');
  return { written: reply === 1, contexts: pairs.length / 2 };
}

/** What a copy keeps of a stored `m` value (the clock, the families), or null when the value is not ours. */
export function metaCopy(raw: string): { clock: number; fam?: ScopeState['fam'] } | null {
  const m = parseJson(raw);
  if (m === null || !metaShape.safeParse(m).success) return null;
  const { clock, fam } = m as Meta;
  return fam ? { clock, fam } : { clock };
}

/** One scope's whole learned state for `GET /rules` (read-only). */
export async function readScope(
  redis: Redis,
  prefix: string,
  tenant: string,
  agent: string,
  /**
   * The epoch marker as the guard last saw it: read in the same transaction as the scope, so a Redis loss
   * between the guard's check and this read (an empty or half-restored Redis) fails with `stateLostMidRead`
   * rather than answering as if the scope had no rules.
   */
  marker?: EpochMarker,
): Promise<ScopeState | null> {
  let all: Record<string, string>;
  if (marker?.value) {
    const [hash, seen] = await execPipeline(
      redis
        .multi()
        .hgetall(learnKey(prefix, tenant, agent))
        .get(marker.key),
      'learned rules read',
    );
    if (seen !== marker.value) throw stateLostMidRead();
    all = hash as Record<string, string>;
  } else all = await redis.hgetall(learnKey(prefix, tenant, agent));
  const meta = parseJson(all[META]);
  if (meta === null || !metaShape.safeParse(meta).success) return null;
  const state = newScopeState();
  assignMeta(state, meta as Meta);
  for (const [field, raw] of Object.entries(all))
    if (field.startsWith('c:')) readGroup(state, field.slice(2), raw);
  return state;
}

/** The scope a rules key names (`learnKey`), or null when the key is not one of `prefix`. */
function scopeOfKey(prefix: string, key: string): { tenant: string; agent: string } | null {
  const head = `${prefix}:aseq:{`;
  const tail = '}:rules';
  if (!key.startsWith(head) || !key.endsWith(tail)) return null;
  const parts = key.slice(head.length, -tail.length).split('|');
  if (parts.length !== 2) return null;
  const [tenant, agent] = parts.map(unescapeKeyPart);
  if (!tenant || !agent || learnKey(prefix, tenant, agent) !== key) return null;
  return { tenant, agent };
}

/**
 * Every scope of `prefix` whose stored counts (`m`) hold active rules, with its hash's PTTL (-1: no expiry), a
 * SCAN page at a time: what the active-rules gauge starts from (start-up, a restore).
 */
export async function* scopesWithActiveRules(
  redis: Redis,
  prefix: string,
): AsyncGenerator<{ tenant: string; agent: string; nActive: number; pttl: number }[]> {
  const match = `${globLiteral(prefix)}:aseq:{*}:rules`;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', match, 'COUNT', 1000);
    cursor = next;
    const scopes = keys.flatMap((k) => scopeOfKey(prefix, k) ?? []);
    if (scopes.length === 0) continue;
    const pipe = redis.pipeline();
    for (const s of scopes) {
      const key = learnKey(prefix, s.tenant, s.agent);
      pipe.hget(key, META);
      pipe.pttl(key);
    }
    const replies = await execPipeline(pipe, 'active rules read');
    const page = [];
    for (const [i, s] of scopes.entries()) {
      const m = parseJson(replies[2 * i]);
      if (m === null || !metaShape.safeParse(m).success) continue;
      const { nActive } = m as Meta;
      if (nActive > 0) page.push({ ...s, nActive, pttl: replies[2 * i + 1] as number });
    }
    yield page;
  } while (cursor !== '0');
}

/**
 * The active-rules gauge from what Redis holds, for the scopes no batch of this process has written yet: at start,
 * and after a restore (a loss clears it). A SCAN of the rules keys, off the batches' path. Each scope stops counting
 * when its rules expire: its hash was given the TTL (plus the sweep's grace) at its last write, and what is left of
 * it says when that was.
 */
export async function seedActiveRulesGauge(
  redis: Redis,
  prefix: string,
  gauge: { seed(): { set(scope: string, n: number, at: number): void; end(): void } },
  scopeTtlMs: number,
  graceMs: number,
): Promise<void> {
  const run = gauge.seed();
  try {
    const life = scopeTtlMs + graceMs;
    for await (const page of scopesWithActiveRules(redis, prefix)) {
      const now = Date.now();
      for (const s of page) {
        const at = scopeTtlMs > 0 && s.pttl >= 0 ? now - Math.max(0, life - s.pttl) : now;
        run.set(scopeId(s.tenant, s.agent), s.nActive, at);
      }
    }
  } finally {
    run.end();
  }
}
