import { recordGrams } from './grams.js';
import { codePointCompare } from './order.js';
import { scopeId, type DetectorOp, type Scope } from './ops.js';
import type { DetectorParams } from './params.js';
import type { GramStat } from './select.js';

interface FirstMessage {
  ts: number;
  eventId: string;
  terms: string[];
}
interface OpenTask {
  /** The partition the task's events arrive on: its idleness is judged on that partition's clock. */
  partition: number;
  events: Map<string, { step: number; tool: string; cost: number }>;
  lastTs: number;
  /** The task's first user message, by (ts, event_id): its terms only. */
  msg: FirstMessage | null;
}
interface WindowRecord {
  task: string;
  ts: number;
  tools: string[];
  costs: number[];
  /** Terms of the task's first user message; null when the task had none. */
  terms: string[] | null;
}
/** What candidate building needs of a window record. */
export interface TermRecord {
  tools: string[];
  terms: string[] | null;
}
interface ScopeState {
  scope: Scope;
  /** Newest ts seen in the scope on any partition: what time-window eviction is measured against. */
  maxTs: number;
  /** Per partition: newest ts seen on it in this scope (its stream time). */
  clocks: Map<number, number>;
  open: Map<string, OpenTask>;
  /**
   * Completed tasks by `doneKey(partition, task)` → the task's last own ts (see `complete`) and partition
   * (retention is judged from it plus taskIdleMs, on that partition's clock: see `expire`). Per partition, as
   * the Redis done buckets are: an id completed on one partition is not known on another.
   */
  done: Map<string, { ts: number; partition: number }>;
  /** Sorted by (ts, task) ascending: the oldest record is first. */
  window: WindowRecord[];
  support: Map<string, number>;
  exact: Map<string, number>;
  cost: Map<string, number>;
  frequent: Set<string>;
}

/**
 * Why an event was not used. `duplicate`: already in its open task, or an event of a closed task at or
 * before its last own ts (a redelivery: see `complete`). `late`: an event of a closed task after its close (for an idle close, after
 * the task's last event: one between it and last + taskIdleMs was never seen, or it would have been the last), or the first event of
 * a task that is already idle on its partition's clock (older than taskIdleMs behind it). `task_limit`:
 * over maxTaskEvents. `misrouted`: an event of a task open on another partition (the topic is keyed by
 * session_id, so a task's events come on one partition; a producer keying otherwise, or a task spanning
 * sessions, breaks that). The task is the partition's it opened on, whose clock closes it.
 */
export const IGNORE_REASONS = ['duplicate', 'late', 'task_limit', 'misrouted'] as const;
export type IgnoreReason = (typeof IGNORE_REASONS)[number];

export interface ApplyResult {
  changed: boolean;
  applied: number;
  /** Total of `ignoredBy`. */
  ignored: number;
  ignoredBy: Record<IgnoreReason, number>;
  completed: number;
}

export const emptyResult = (): ApplyResult => ({
  changed: false,
  applied: 0,
  ignored: 0,
  ignoredBy: { duplicate: 0, late: 0, task_limit: 0, misrouted: 0 },
  completed: 0,
});

const doneKey = (partition: number, task: string) => `${partition}\u001f${task}`;

const byTsTask = (a: { ts: number; task: string }, b: { ts: number; task: string }) =>
  a.ts - b.ts || codePointCompare(a.task, b.task);

/**
 * The detector's streaming state, in memory: open tasks, the completed-record window and the support counts.
 * This is the executable definition of what the Redis scripts (adapters/redis/lua) do, event for event; the
 * offline command runs it, and the property test holds it against the batch reference.
 */
export class DetectorState {
  private readonly scopes = new Map<string, ScopeState>();
  constructor(readonly params: DetectorParams) {}

  private scope(s: Scope): ScopeState {
    const id = scopeId(s);
    let st = this.scopes.get(id);
    if (!st) {
      st = {
        scope: s,
        maxTs: 0,
        clocks: new Map(),
        open: new Map(),
        done: new Map(),
        window: [],
        support: new Map(),
        exact: new Map(),
        cost: new Map(),
        frequent: new Set(),
      };
      this.scopes.set(id, st);
    }
    return st;
  }

  scopesSeen(): Scope[] {
    return [...this.scopes.values()].map((s) => s.scope);
  }

  /** Applies ops in order; the result says whether any scope's window changed. */
  applyAll(ops: Iterable<DetectorOp>): ApplyResult {
    const r = emptyResult();
    for (const op of ops) this.apply(op, r);
    return r;
  }

  apply(op: DetectorOp, r: ApplyResult = emptyResult()): ApplyResult {
    const st = this.scope(op.scope);
    const p = this.params;
    const part = op.partition ?? 0;
    if (op.ts > st.maxTs) st.maxTs = op.ts;
    const clock = Math.max(st.clocks.get(part) ?? 0, op.ts);
    st.clocks.set(part, clock);
    // The partition's clock moved: its tasks idle for taskIdleMs complete first, so a late event cannot
    // reopen them. Other partitions' tasks wait for their own clocks (one partition running ahead, e.g.
    // catching up after a restart, must not cut them).
    this.sweep(st, part, clock, r);
    const closed = st.done.get(doneKey(part, op.task));
    const t0 = st.open.get(op.task);
    if (closed) {
      this.ignore(r, op.ts > closed.ts ? 'late' : 'duplicate');
    } else if (t0 && t0.partition !== part) {
      this.ignore(r, 'misrouted');
    } else if (!t0 && op.ts + p.taskIdleMs <= clock) {
      // It would open a task already idle on its partition's clock: a fragment of an older task.
      this.ignore(r, 'late');
    } else if (op.kind === 'call') {
      const t = t0 ?? this.openTask(st, op.task, op.ts, part);
      if (t.events.has(op.eventId)) this.ignore(r, 'duplicate');
      else if (t.events.size >= p.maxTaskEvents) this.ignore(r, 'task_limit');
      else {
        t.events.set(op.eventId, { step: op.step, tool: op.tool, cost: op.cost });
        r.applied++;
      }
      if (op.ts > t.lastTs) t.lastTs = op.ts;
    } else if (op.kind === 'msg') {
      const t = t0 ?? this.openTask(st, op.task, op.ts, part);
      const m = t.msg;
      if (m === null || op.ts < m.ts || (op.ts === m.ts && codePointCompare(op.eventId, m.eventId) < 0))
        t.msg = { ts: op.ts, eventId: op.eventId, terms: op.terms };
      if (op.ts > t.lastTs) t.lastTs = op.ts;
      // The message kept, delivered again: a duplicate, as a call already in its task is. (Only the first
      // message is kept, so a later one delivered again still counts as applied.)
      if (m !== null && m.eventId === op.eventId) this.ignore(r, 'duplicate');
      else r.applied++;
    } else {
      this.complete(st, op.task, op.ts, part, r);
      r.applied++;
    }
    this.expire(st, part, clock, r);
    return r;
  }

  private ignore(r: ApplyResult, reason: IgnoreReason) {
    r.ignored++;
    r.ignoredBy[reason]++;
  }

  private openTask(st: ScopeState, task: string, ts: number, partition: number): OpenTask {
    const t: OpenTask = { partition, events: new Map(), lastTs: ts, msg: null };
    st.open.set(task, t);
    return t;
  }

  private sweep(st: ScopeState, part: number, clock: number, r: ApplyResult) {
    const due = [...st.open]
      .filter(([, t]) => t.partition === part && t.lastTs + this.params.taskIdleMs <= clock)
      .map(([task, t]) => ({ task, ts: t.lastTs + this.params.taskIdleMs, last: t.lastTs }))
      .sort(byTsTask);
    for (const d of due) this.complete(st, d.task, d.ts, part, r, d.last);
  }

  /**
   * `lastOwnTs`: the newest ts still counted as the task's own, a redelivery when it comes again (`duplicate`);
   * after it, `late`. A task_completed is itself the task's, so it is `ts`. An idle close is the task's last
   * event's ts: every event the task had is at or before it (its last ts is their maximum), so one after it
   * arriving once the task is closed was never seen, however close to the idle close its ts is.
   */
  private complete(st: ScopeState, task: string, ts: number, part: number, r: ApplyResult, lastOwnTs = ts) {
    const open = st.open.get(task);
    st.open.delete(task);
    const partition = open?.partition ?? part;
    st.done.set(doneKey(partition, task), { ts: lastOwnTs, partition });
    const events = open
      ? [...open.events].sort(([ea, a], [eb, b]) => a.step - b.step || codePointCompare(ea, eb))
      : [];
    const rec: WindowRecord = {
      task,
      ts,
      tools: events.map(([, e]) => e.tool),
      costs: events.map(([, e]) => e.cost),
      terms: open?.msg?.terms ?? null,
    };
    // A task id seen again after its id was forgotten (doneRetentionMs) replaces its older record: one record
    // per task id, as the Redis window (a ZSET keyed by task id) holds them.
    const prev = st.window.findIndex((w) => w.task === task);
    if (prev >= 0) this.count(st, st.window.splice(prev, 1)[0]!, -1);
    let i = st.window.length;
    while (i > 0 && byTsTask(st.window[i - 1]!, rec) > 0) i--;
    st.window.splice(i, 0, rec);
    this.count(st, rec, 1);
    r.completed++;
    r.changed = true;
    while (st.window.length > this.params.lookback) this.count(st, st.window.shift()!, -1);
  }

  /**
   * Time-based eviction: the window against the scope's newest ts (which records it holds is then a function
   * of the set of completed records and that maximum, whatever order partitions were read in); remembered
   * task ids against their own partition's clock, taskIdleMs + doneRetentionMs after their last own ts: for an
   * idle-closed task that is doneRetentionMs after its close, so that an event of it, not yet idle on the clock
   * (within taskIdleMs of it), finds its id remembered (doneRetentionMs ≥ taskIdleMs) and never reopens it.
   */
  private expire(st: ScopeState, part: number, clock: number, r: ApplyResult) {
    const p = this.params;
    if (p.windowMs !== null) {
      while (st.window.length > 0 && st.window[0]!.ts <= st.maxTs - p.windowMs) {
        this.count(st, st.window.shift()!, -1);
        r.changed = true;
      }
    }
    for (const [key, d] of st.done)
      if (d.partition === part && d.ts < clock - p.doneRetentionMs - p.taskIdleMs) st.done.delete(key);
  }

  private count(st: ScopeState, rec: WindowRecord, d: 1 | -1) {
    const { grams, whole } = recordGrams(rec.tools, rec.costs, this.params);
    const minOcc = this.params.minOccurrences;
    for (const g of grams) {
      const s = (st.support.get(g.key) ?? 0) + d;
      const c = (st.cost.get(g.key) ?? 0) + d * g.cost;
      if (s === 0) {
        st.support.delete(g.key);
        st.cost.delete(g.key);
      } else {
        st.support.set(g.key, s);
        st.cost.set(g.key, c);
      }
      if (s >= minOcc) st.frequent.add(g.key);
      else st.frequent.delete(g.key);
    }
    if (whole !== null) {
      const x = (st.exact.get(whole) ?? 0) + d;
      if (x === 0) st.exact.delete(whole);
      else st.exact.set(whole, x);
    }
  }

  /** The frequent sequences of a scope, with their counts. */
  frequentStats(s: Scope): GramStat[] {
    const st = this.scopes.get(scopeId(s));
    if (!st) return [];
    return [...st.frequent].map((key) => ({
      key,
      support: st.support.get(key)!,
      exact: st.exact.get(key) ?? 0,
      cost: st.cost.get(key)!,
    }));
  }

  /** The window's records (tools and request terms), for the candidates' request terms. */
  windowRecords(s: Scope): TermRecord[] {
    return this.scopes.get(scopeId(s))?.window.map((w) => ({ tools: w.tools, terms: w.terms })) ?? [];
  }

  /** Window contents (task ids, oldest first), for tests. */
  windowTasks(s: Scope): string[] {
    return this.scopes.get(scopeId(s))?.window.map((w) => w.task) ?? [];
  }
}
