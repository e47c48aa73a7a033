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
  maxTs: number;
  open: Map<string, OpenTask>;
  done: Map<string, number>;
  /** Sorted by (ts, task) ascending: the oldest record is first. */
  window: WindowRecord[];
  support: Map<string, number>;
  exact: Map<string, number>;
  cost: Map<string, number>;
  frequent: Set<string>;
}

export interface ApplyResult {
  changed: boolean;
  applied: number;
  ignored: number;
  completed: number;
}

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
    const r: ApplyResult = { changed: false, applied: 0, ignored: 0, completed: 0 };
    for (const op of ops) this.apply(op, r);
    return r;
  }

  apply(
    op: DetectorOp,
    r: ApplyResult = { changed: false, applied: 0, ignored: 0, completed: 0 },
  ): ApplyResult {
    const st = this.scope(op.scope);
    const p = this.params;
    if (op.ts > st.maxTs) st.maxTs = op.ts;
    // The clock moved: tasks idle for taskIdleMs complete first, so a late event cannot reopen them.
    this.sweep(st, r);
    if (st.done.has(op.task)) {
      r.ignored++;
    } else if (op.kind === 'call') {
      const t = this.openTask(st, op.task, op.ts);
      if (!t.events.has(op.eventId) && t.events.size < p.maxTaskEvents) {
        t.events.set(op.eventId, { step: op.step, tool: op.tool, cost: op.cost });
        r.applied++;
      } else {
        r.ignored++;
      }
      if (op.ts > t.lastTs) t.lastTs = op.ts;
    } else if (op.kind === 'msg') {
      const t = this.openTask(st, op.task, op.ts);
      const m = t.msg;
      if (m === null || op.ts < m.ts || (op.ts === m.ts && codePointCompare(op.eventId, m.eventId) < 0))
        t.msg = { ts: op.ts, eventId: op.eventId, terms: op.terms };
      if (op.ts > t.lastTs) t.lastTs = op.ts;
      r.applied++;
    } else {
      this.complete(st, op.task, op.ts, r);
      r.applied++;
    }
    this.expire(st, r);
    return r;
  }

  private openTask(st: ScopeState, task: string, ts: number): OpenTask {
    let t = st.open.get(task);
    if (!t) {
      t = { events: new Map(), lastTs: ts, msg: null };
      st.open.set(task, t);
    }
    return t;
  }

  private sweep(st: ScopeState, r: ApplyResult) {
    const due = [...st.open]
      .filter(([, t]) => t.lastTs + this.params.taskIdleMs <= st.maxTs)
      .map(([task, t]) => ({ task, ts: t.lastTs + this.params.taskIdleMs }))
      .sort(byTsTask);
    for (const d of due) this.complete(st, d.task, d.ts, r);
  }

  private complete(st: ScopeState, task: string, ts: number, r: ApplyResult) {
    const open = st.open.get(task);
    st.open.delete(task);
    st.done.set(task, ts);
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
    let i = st.window.length;
    while (i > 0 && byTsTask(st.window[i - 1]!, rec) > 0) i--;
    st.window.splice(i, 0, rec);
    this.count(st, rec, 1);
    r.completed++;
    r.changed = true;
    while (st.window.length > this.params.lookback) this.count(st, st.window.shift()!, -1);
  }

  /** Time-based eviction (window and remembered task ids), on the event-time clock. */
  private expire(st: ScopeState, r: ApplyResult) {
    const p = this.params;
    if (p.windowMs !== null) {
      while (st.window.length > 0 && st.window[0]!.ts <= st.maxTs - p.windowMs) {
        this.count(st, st.window.shift()!, -1);
        r.changed = true;
      }
    }
    for (const [task, ts] of st.done) if (ts < st.maxTs - p.doneRetentionMs) st.done.delete(task);
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
