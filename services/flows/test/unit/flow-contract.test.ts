import { describe, expect, it } from 'vitest';
import { CONTRACTS, type RegisteredFlow } from '../../../../schemas/index.js';
import { detectorRecord as record } from '../detector-record.js';
import { cutText } from '../../../../shared/core/text.js';
import { flowFromCandidate, flowViolations } from '../../src/core/registry.js';

const detectorRecord = (tools: string[], title?: string, name?: string) =>
  record(tools, { ...(title !== undefined ? { title } : {}), ...(name !== undefined ? { name } : {}) });

/** What the sink checks before a record leaves (shared/kafka/sink.ts): the flows.v1 contract. */
const onTopic = (flow: RegisteredFlow) => {
  const r = CONTRACTS['flows.v1']!.schema.safeParse({ schema_version: 1, flow });
  return r.success ? 'valid' : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
};

// 11 tau-bench-like tool names (DETECTOR_MAX_LENGTH defaults to 12): the detector's name is > 256 characters.
const LONG = [
  'get_user_details',
  'get_reservation_details',
  'search_direct_flight',
  'search_onestop_flight',
  'update_reservation_flights',
  'update_reservation_baggages',
  'update_reservation_passengers',
  'calculate',
  'book_reservation',
  'send_certificate',
  'transfer_to_human_agents',
];

describe('a promoted flow within the flows.v1 contract', () => {
  it('the flow of a detector candidate of 11 tools is valid on the flows topic, its name the start of the long one', () => {
    const r = detectorRecord(LONG);
    const long = r.promotion_effect!.proposed_flow.name;
    expect(long.length).toBeGreaterThan(256);
    const f = flowFromCandidate(r, 1);
    expect(onTopic(f)).toBe('valid');
    expect(f.name).toHaveLength(256);
    expect(long.startsWith(f.name)).toBe(true);
  });

  it('a desired effect (the title) past 4096 characters is cut to 4096', () => {
    const f = flowFromCandidate(detectorRecord(['a', 'b'], 'x'.repeat(5000)), 1);
    expect(onTopic(f)).toBe('valid');
    expect(f.desired_effects[0]).toBe('x'.repeat(4096));
  });

  it('a cut never splits a surrogate pair', () => {
    // '😀' is two UTF-16 code units: a cut at 256 would fall between them.
    const title = 'a' + '😀'.repeat(200);
    const f = flowFromCandidate(detectorRecord(['a', 'b'], title, title), 1);
    expect(f.name).toBe('a' + '😀'.repeat(127));
    expect(f.desired_effects[0]).toBe(title);
    expect(cutText('ab😀', 3)).toBe('ab');
    expect(cutText('ab😀', 4)).toBe('ab😀');
    expect(cutText('abc', 3)).toBe('abc');
  });

  it('flowViolations names what a flow breaks (300 steps, no loop), and nothing for a valid one', () => {
    const tools = Array.from({ length: 300 }, (_, i) => `tool_${i}`);
    expect(flowViolations(flowFromCandidate(detectorRecord(tools), 1))).toMatch(/^steps: /);
    expect(flowViolations(flowFromCandidate(detectorRecord(LONG), 1))).toBeNull();
  });
});
