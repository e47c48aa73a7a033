import { describe, expect, it } from 'vitest';
import {
  FlowRegistry,
  flowFromCandidate,
  promotedFlowId,
  unscopedPromotedFlowId,
} from '../../src/core/registry.js';
import { dedupeKeyOf, detectorRecord } from '../detector-record.js';

describe('promoted flow ids per scope', () => {
  it('the same candidate key in two scopes gives two ids; the same scope always the same one', () => {
    const k = 'flow_offload:a→b';
    const ids = [
      promotedFlowId('t', 'a', k),
      promotedFlowId('t', 'b', k),
      promotedFlowId('u', 'a', k),
      // Parts that would join to the same text must not give the same id.
      promotedFlowId('t/a', '', k),
      promotedFlowId('t', 'a/' + k, ''),
    ];
    expect(new Set(ids).size).toBe(ids.length);
    expect(promotedFlowId('t', 'a', k)).toBe(ids[0]);
    expect(ids).not.toContain(unscopedPromotedFlowId(k));
  });

  it("two agents' flows of the same tool sequence both stay registered", () => {
    const tools = ['get_user_details', 'get_reservation_details'];
    const registry = new FlowRegistry();
    for (const agent of ['agent-a', 'agent-b'])
      registry.upsert(flowFromCandidate(detectorRecord(tools, { agent }), 1));
    expect(registry.list('default', 'agent-a').map((f) => f.dedupe_key)).toEqual([dedupeKeyOf(tools)]);
    expect(registry.list('default', 'agent-b').map((f) => f.dedupe_key)).toEqual([dedupeKeyOf(tools)]);
  });
});
