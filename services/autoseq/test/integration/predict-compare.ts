import { expect } from 'vitest';
import type { NextActionRecord } from '../../../../schemas/index.js';
import type { PredictLine } from '../../src/core/learn/engine.js';

/**
 * Holds the service's next-action records to `paver predict`'s lines over the same tool calls: the record
 * published after call j of a task is the proposal predict holds for call j+1. Returns how many were compared.
 */
export function expectSameAsPredict(
  calls: { event_id: string; task_id: string }[],
  byEvent: Map<string, NextActionRecord>,
  predicted: PredictLine[],
): number {
  const prevCall = new Map<string, string>();
  let compared = 0;
  calls.forEach((e, i) => {
    const before = prevCall.get(e.task_id);
    prevCall.set(e.task_id, e.event_id);
    if (!before) return;
    const rec = byEvent.get(before)!;
    const fromService =
      rec.origin === 'learned'
        ? {
            tool: rec.tool,
            args: rec.args,
            origin: 'learned',
            state: rec.rule_state,
            rule_id: rec.rule_id,
            confidence: rec.confidence,
          }
        : null;
    expect({ event: e.event_id, proposal: fromService }).toEqual({
      event: e.event_id,
      proposal: predicted[i]!.proposal,
    });
    compared++;
  });
  return compared;
}
