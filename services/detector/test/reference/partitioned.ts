/**
 * Independent batch definition of which task records exist when events come from several partitions
 * (issue 12): written from the README's contract, not from core/state.ts. Each partition is read in its own
 * order with its own clock per scope (the newest ts seen on it); a task completes at its task_completed
 * event, or at last event + taskIdleMs once its partition's clock reaches that; events of a completed task,
 * and a first event already idle on its partition's clock, are not used. The window and the candidates are
 * then batch.ts's, over all partitions' records, which makes the answer independent of how partitions were
 * interleaved.
 */
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { requestTermsOf } from '../../src/core/terms.js';
import type { BatchRecord } from './batch.js';

interface Task {
  calls: Map<string, { step: number; tool: string; cost: number | undefined }>;
  last: number;
  msg: { ts: number; id: string; text: string } | null;
}

const bytes = (a: string, b: string) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));

function toRecord(task: string, t: Task | undefined, ts: number, requestTerms: boolean): BatchRecord {
  const calls = [...(t?.calls ?? [])].sort(([ia, a], [ib, b]) => a.step - b.step || bytes(ia, ib));
  return {
    task,
    ts,
    tools: calls.map(([, c]) => c.tool),
    costs: calls.map(([, c]) => c.cost),
    terms: t?.msg ? (requestTerms ? requestTermsOf(t.msg.text) : []) : null,
  };
}

/** Completed records and newest ts per scope (`agent_id`), from each partition's log in its own order. */
export function partitionedRecords(
  logs: readonly (readonly ToolCallsEvent[])[],
  idleMs: number,
  requestTerms: boolean,
): Map<string, { records: BatchRecord[]; maxTs: number }> {
  const out = new Map<string, { records: BatchRecord[]; maxTs: number }>();
  const scopeOut = (s: string) => {
    let o = out.get(s);
    if (!o) out.set(s, (o = { records: [], maxTs: 0 }));
    return o;
  };
  for (const log of logs) {
    const scopes = new Set(log.map((e) => e.agent_id));
    for (const scope of scopes) {
      const o = scopeOut(scope);
      let clock = 0;
      const open = new Map<string, Task>();
      const closed = new Set<string>();
      for (const e of log) {
        if (e.agent_id !== scope) continue;
        o.maxTs = Math.max(o.maxTs, e.ts);
        clock = Math.max(clock, e.ts);
        for (const [task, t] of [...open]) {
          if (t.last + idleMs > clock) continue;
          o.records.push(toRecord(task, t, t.last + idleMs, requestTerms));
          open.delete(task);
          closed.add(task);
        }
        if (e.type === 'user_message' && e.task_id === undefined) continue;
        const task = e.task_id!;
        if (closed.has(task)) continue;
        if (!open.has(task) && e.ts + idleMs <= clock) continue;
        if (e.type === 'task_completed') {
          o.records.push(toRecord(task, open.get(task), e.ts, requestTerms));
          open.delete(task);
          closed.add(task);
          continue;
        }
        const t = open.get(task) ?? { calls: new Map(), last: e.ts, msg: null };
        open.set(task, t);
        t.last = Math.max(t.last, e.ts);
        if (e.type === 'tool_call') {
          if (!t.calls.has(e.event_id))
            t.calls.set(e.event_id, { step: e.step, tool: e.tool, cost: e.cost_cents });
        } else if (!t.msg || e.ts < t.msg.ts || (e.ts === t.msg.ts && bytes(e.event_id, t.msg.id) < 0)) {
          t.msg = { ts: e.ts, id: e.event_id, text: e.text };
        }
      }
    }
  }
  return out;
}
