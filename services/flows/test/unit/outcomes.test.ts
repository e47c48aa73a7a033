import { describe, expect, it } from 'vitest';
import { flowCandidate, flowsFileV1, type FlowCandidate } from '../../../../schemas/index.js';
import { OutcomeBook, OutcomeMemory, outcomeScores, pastRunsOf } from '../../src/core/outcomes.js';
import { FlowRegistry, flowsFromCandidates, registerManual } from '../../src/core/registry.js';
import { matchSteps } from '../../src/core/score.js';
import { DEFAULT_POLICY, recall } from '../../src/core/select.js';
import { SessionTracker } from '../../src/core/sessions.js';
import { requestTermsOf } from '../../../../shared/core/terms.js';

const flow = (name: string, tools: string[], text = '') =>
  registerManual(
    {
      tenant_id: 'default',
      agent_id: 'default',
      name,
      description: text,
      condition: '',
      desired_effects: [],
      steps: tools.map((t) => ({ name: t, skill_key: t })),
    },
    0,
  );

describe('matchSteps', () => {
  it('starts at the first call of the first tool; the first mismatch is proposed and ends the flow', () => {
    expect(matchSteps(['a', 'b', 'c'], ['x', 'a', 'b', 'c', 'd'])).toEqual({ proposed: 3, matched: 3 });
    expect(matchSteps(['a', 'b', 'c'], ['a', 'b', 'z', 'c'])).toEqual({ proposed: 3, matched: 2 });
    expect(matchSteps(['a', 'b', 'b', 'b'], ['a', 'b', 'c'])).toEqual({ proposed: 3, matched: 2 });
    expect(matchSteps(['a', 'b'], ['a'])).toEqual({ proposed: 2, matched: 1 });
    expect(matchSteps(['q', 'b'], ['a', 'b'])).toEqual({ proposed: 0, matched: 0 });
    expect(matchSteps([], ['a'])).toEqual({ proposed: 0, matched: 0 });
  });
});

describe('past outcomes', () => {
  const close = flow('close', ['lookup', 'freeze', 'close']);
  const review = flow('review', ['lookup', 'audit', 'report']);
  it('judges each flow on the most similar past runs: matched steps minus the cost of wrong ones', () => {
    const mem = new OutcomeMemory(100);
    mem.add({ terms: ['close', 'account'], calls: ['lookup', 'freeze', 'close'] });
    mem.add({ terms: ['audit', 'spending'], calls: ['lookup', 'audit', 'report'] });
    const p = { capacity: 100, neighbours: 1, wrongCost: 4 };
    const s = outcomeScores(mem, ['close', 'my', 'account'], [close, review], p);
    expect(s.get(close.id)).toBe(3);
    expect(s.get(review.id)).toBe(1 - 4);
    expect(outcomeScores(mem, ['weather'], [close, review], p).size).toBe(0);
  });
  it('forgets the oldest runs past its capacity', () => {
    const mem = new OutcomeMemory(2);
    for (const t of ['a', 'b', 'c']) mem.add({ terms: [t], calls: [] });
    expect(mem.size).toBe(2);
    expect(mem.neighbours(['a'], 5)).toEqual([]);
    expect(mem.neighbours(['c'], 5)).toHaveLength(1);
  });
  it('a flow that did not pay off for a request drops for similar requests next time', () => {
    const reg = new FlowRegistry();
    // The words favour 'review'; what agents do for this request is 'close'.
    reg.upsert(flow('review', ['lookup', 'audit', 'report'], 'help with the account review'));
    reg.upsert(flow('close', ['lookup', 'freeze', 'close'], 'account'));
    const book = new OutcomeBook({ capacity: 10, neighbours: 5, wrongCost: 4 });
    const q = 'please help with my account';
    const pick = () =>
      recall(reg, 'default', 'default', q, [], DEFAULT_POLICY, null, book.scorer('default', 'default', q))[0]
        ?.flow.name;
    expect(pick()).toBe('review');
    book.add('default', 'default', { terms: requestTermsOf(q), calls: ['lookup', 'freeze', 'close'] });
    expect(pick()).toBe('close');
  });
  it('past runs of a stream: the runs the service records (a first request opens one, task_completed ends it)', () => {
    const base = { tenant_id: 'default', agent_id: 'default' } as const;
    const ev = (o: Record<string, unknown>) => ({ ...base, ts: 1, ...o }) as never;
    const runs = pastRunsOf(
      [
        // Before any request: no run holds it.
        ev({ type: 'tool_call', event_id: 'c0', session_id: 's1', step: 0, tool: 'ping', args: {} }),
        ev({ type: 'user_message', event_id: 'u1', session_id: 's1', text: 'Cancel booking ABC123 please' }),
        ev({ type: 'tool_call', event_id: 'c1', session_id: 's1', step: 1, tool: 'find', args: {} }),
        ev({ type: 'user_message', event_id: 'u2', session_id: 's1', text: 'and refund it' }),
        ev({ type: 'tool_call', event_id: 'c2', session_id: 's2', step: 0, tool: 'find', args: {} }),
        ev({ type: 'task_completed', event_id: 'd1', session_id: 's1' }),
        // The session's second task is a run of its own.
        ev({ type: 'user_message', event_id: 'u3', session_id: 's1', text: 'Book a flight to Paris' }),
        ev({ type: 'tool_call', event_id: 'c3', session_id: 's1', step: 2, tool: 'search', args: {} }),
        ev({ type: 'task_completed', event_id: 'd2', session_id: 's1' }),
        // Opened, never completed: no run yet.
        ev({ type: 'user_message', event_id: 'u4', session_id: 's3', text: 'Change my seat' }),
        ev({ type: 'tool_call', event_id: 'c4', session_id: 's3', step: 0, tool: 'seat', args: {} }),
      ],
      10,
    );
    expect(runs).toEqual([
      { terms: ['cancel', 'booking'], calls: ['find'] },
      { terms: ['book', 'flight', 'paris'], calls: ['search'] },
    ]);
  });
});

describe('sessions', () => {
  it('the first request opens a session; done closes it once; the oldest open one leaves past the bound', () => {
    const t = new SessionTracker(2);
    t.onRequest('a', { tenant: 't', agent: 'a', terms: ['x'], shadow: null });
    t.onRequest('a', { tenant: 't', agent: 'a', terms: ['y'], shadow: null });
    t.onCall('a', { tool: 'k', args: {} });
    t.onCall('nobody', { tool: 'k', args: {} });
    expect(t.onDone('a')).toMatchObject({ terms: ['x'], calls: ['k'] });
    expect(t.onDone('a')).toBeNull();
    for (const s of ['b', 'c', 'd']) t.onRequest(s, { tenant: 't', agent: 'a', terms: [], shadow: null });
    expect(t.size).toBe(2);
    expect(t.onDone('b')).toBeNull();
  });
});

describe('from-candidates', () => {
  const cand: FlowCandidate = flowCandidate.parse({
    tool_sequence: ['find', 'get', 'get'],
    occurrence_count: 4,
    match_type: 'exact',
    estimated_token_savings: 3,
    avg_cost_per_execution: 1,
    dedupe_key: 'flow_offload:find>get>get',
    proposed_flow: {
      name: 'Auto: find → get → get',
      description: 'Auto-generated.',
      steps: ['find', 'get', 'get'].map((t, i) => ({
        id: `step_${i + 1}`,
        name: t,
        skill_key: t,
        depends_on: [],
        output_key: `step_${i + 1}`,
        retry_max: 2,
        retry_backoff: 1,
        timeout_seconds: 120,
        on_failure: 'stop',
        input_map: {},
      })),
      tags: ['auto-generated'],
    },
    request_terms: {
      tasks: 4,
      terms: [
        { term: 'refund', df: 2 },
        { term: 'exchange', df: 3 },
      ],
    },
  });
  it('is a valid flows file whose flows speak the requests’ words, each tool named once', () => {
    const flows = flowsFromCandidates([cand], { tenant: 'default', agent: 'default' });
    expect(flowsFileV1.safeParse(flows).success).toBe(true);
    expect(flows[0]!.description).toContain('exchange, refund');
    expect(flows[0]!.condition).toBe(
      'Requests about exchange, refund; the agent handled them by running find, get.',
    );
    // find, get, get: the repeated lookup is one loop step, not two copies.
    expect(flows[0]!.steps).toHaveLength(2);
    expect(flows[0]!.steps[1]).toMatchObject({ skill_key: 'get', for_each: { over: null, body: 1 } });
  });
});
