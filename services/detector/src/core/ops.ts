import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { requestTermsOf } from './terms.js';

/** Costs are kept as integers of 1/10,000 cent so that adding and removing records never drifts. */
export const COST_SCALE = 10_000;
/** A step without cost_cents costs 1 (then savings count LLM steps). */
export const DEFAULT_COST_UNITS = COST_SCALE;

export const costUnits = (costCents: number | undefined): number =>
  costCents === undefined ? DEFAULT_COST_UNITS : Math.round(costCents * COST_SCALE);

export interface Scope {
  tenant: string;
  agent: string;
}
export const scopeId = (s: Scope): string => `${s.tenant}\u001f${s.agent}`;

/**
 * `partition`: the source partition (0 offline). Events of one session, hence of one task, share a
 * partition, in order: the one thing Kafka orders.
 */
export type DetectorOp = (
  | {
      kind: 'call';
      scope: Scope;
      task: string;
      eventId: string;
      ts: number;
      step: number;
      tool: string;
      cost: number;
    }
  | { kind: 'done'; scope: Scope; task: string; eventId: string; ts: number }
  /** A user message of a task: only its terms travel (empty when request terms are off), never the text. */
  | { kind: 'msg'; scope: Scope; task: string; eventId: string; ts: number; terms: string[] }
) & {
  partition?: number;
  /** The source offset (streaming only): where a rebuild must start replaying to see this event again. */
  offset?: string;
};

/**
 * Whether an event claims a time further than `maxAheadMs` after its Kafka record's timestamp (when it was
 * produced, or appended with `LogAppendTime`): a clock that runs ahead, or a ts in the wrong unit. Such an event
 * would move its partition's clock (which never goes back) past every right one. Decided from the record
 * alone, so a replay decides the same. A record without a timestamp (-1, old formats) is not judged.
 */
export function aheadOfRecord(eventTs: number, recordTimestamp: string, maxAheadMs: number): boolean {
  const produced = Number(recordTimestamp);
  return maxAheadMs > 0 && Number.isFinite(produced) && produced > 0 && eventTs > produced + maxAheadMs;
}

/**
 * Tool calls make a record; a completion closes it; a task's user message is an event of the task (it keeps
 * the task open) whose terms describe the request. A user message without task_id belongs to no record.
 */
export function toOp(
  e: ToolCallsEvent,
  requestTerms = true,
  partition = 0,
  offset?: string,
): DetectorOp | null {
  const scope = { tenant: e.tenant_id, agent: e.agent_id };
  // Built whole, in one shape per kind (no spread of a partial op): this runs once per consumed event.
  let op: DetectorOp;
  if (e.type === 'tool_call') {
    op = {
      kind: 'call',
      scope,
      task: e.task_id,
      eventId: e.event_id,
      ts: e.ts,
      step: e.step,
      tool: e.tool,
      cost: costUnits(e.cost_cents),
      partition,
    };
  } else if (e.type === 'task_completed') {
    op = { kind: 'done', scope, task: e.task_id, eventId: e.event_id, ts: e.ts, partition };
  } else {
    if (e.task_id === undefined) return null;
    op = {
      kind: 'msg',
      scope,
      task: e.task_id,
      eventId: e.event_id,
      ts: e.ts,
      terms: requestTerms ? requestTermsOf(e.text) : [],
      partition,
    };
  }
  if (offset !== undefined) op.offset = offset;
  return op;
}
