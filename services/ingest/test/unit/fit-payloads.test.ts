import { describe, expect, it } from 'vitest';
import type { ToolCallEvent } from '../../../../schemas/index.js';
import { WIRE_HEADER_BYTES } from '../../../../shared/codec.js';
import { recordBatchBytes } from '../../../../shared/kafka/requests.js';
import { fitPayloads } from '../../src/adapters/handler.js';

const event = {
  type: 'tool_call',
  event_id: 'e1',
  ts: 1_700_000_000_000,
  tenant_id: 'acme',
  agent_id: 'bot',
  session_id: 's1',
  task_id: 't1',
  step: 0,
  tool: 'search',
  args: { q: 'a'.repeat(500) },
  observation: 'o'.repeat(1_000),
} as ToolCallEvent;

/** The record as the sink measures it (the broker's count), the encoded value as large as a registry's. */
const recordBytes = (v: unknown) =>
  recordBatchBytes(Buffer.byteLength('s1'), Buffer.byteLength(JSON.stringify(v)) + WIRE_HEADER_BYTES);

describe('fitPayloads', () => {
  it('fits a tool_call under the limit as the sink counts it, framing and key included', () => {
    const { observation: _o, ...withArgs } = event;
    // Key, value and wire header of the event without its result come to the limit exactly: it fitted by that
    // count, came out about 70 bytes over by the sink's, and the sink left the whole tool_call out.
    const limit = Buffer.byteLength('s1') + Buffer.byteLength(JSON.stringify(withArgs)) + WIRE_HEADER_BYTES;
    const omitted: string[] = [];
    const out = fitPayloads(limit, (f) => omitted.push(f))(event) as ToolCallEvent;
    expect(recordBytes(out)).toBeLessThanOrEqual(limit);
    expect(out).not.toHaveProperty('args');
    expect(out).not.toHaveProperty('observation');
    expect(omitted.sort()).toEqual(['args', 'observation']);
    // At the sink's count, the event without its result is what fits.
    const exact = fitPayloads(recordBytes(withArgs), () => {})(event) as ToolCallEvent;
    expect(exact).toEqual(withArgs);
  });
});
