import { describe, expect, it } from 'vitest';
import type { FlowStep, ToolCallsEvent } from '../../../../schemas/index.js';
import {
  EvidenceBook,
  evidenceChars,
  evidenceOf,
  learnInputs,
  occurrenceOf,
  type EvidenceRun,
} from '../../src/core/dataflow.js';
import { SessionTracker } from '../../src/core/sessions.js';
import { collapsedSteps, stepsOf } from '../../src/core/registry.js';

const step = (tool: string, i: number): FlowStep => ({
  id: `s${i}`,
  name: tool,
  skill_key: tool,
  depends_on: [],
  output_key: `s${i}`,
  retry_max: 2,
  retry_backoff: 1,
  timeout_seconds: 120,
  on_failure: 'stop',
  input_map: { input: '{{_trigger.input}}' },
});
/** find_user → get_order × n → refund: the orders walked in list order, the refund for the user. */
const run = (user: string, orders: string[], code: string, extra?: string): EvidenceRun => ({
  userText: `hello, my code is ${code}${extra ? ` and ${extra}` : ''}`,
  calls: [
    { tool: 'warmup', args: {}, observation: 'ok' },
    { tool: 'find_user', args: { code }, observation: { user_id: user, orders } },
    ...orders.map((o) => ({ tool: 'get_order', args: { order_id: o }, observation: { id: o, total: 3 } })),
    {
      tool: 'refund',
      args: { user_id: user, note: `n-${user}-${code.length}`, mode: 'card' },
      observation: 'done',
    },
  ],
});
const flowSteps = () => collapsedSteps(['find_user', 'get_order', 'get_order', 'refund'].map(step));

describe('input_map from data flow', () => {
  const runs = [
    run('u1', ['A1', 'B2'], 'XK12QP'),
    run('u2', ['C3', 'D4', 'E5'], 'ZZ98AB'),
    run('u3', ['F6'], 'MN45CD', 'QQ11QQ'),
  ];
  it('finds each occurrence as the scorer does, loops taking every repetition', () => {
    expect(occurrenceOf(flowSteps(), runs[1]!.calls)).toEqual([[1], [2, 3, 4], [5]]);
    expect(occurrenceOf(flowSteps(), [{ tool: 'find_user' }, { tool: 'refund' }])).toBeNull();
  });
  it('binds each argument to the earlier step output, list element or trigger input that fed it every time', () => {
    const s = learnInputs(flowSteps(), runs);
    expect(s[0]).toMatchObject({
      inputs: 'data_flow',
      input_map: { code: '{{_trigger.input ~ /[A-Z]+[0-9]+[A-Z]+/ #0}}' },
      unbound: [],
    });
    expect(s[1]).toMatchObject({
      input_map: { order_id: '{{item}}' },
      for_each: { over: '{{step_1.output.orders}}', body: 1 },
    });
    expect(s[2]).toMatchObject({
      input_map: { user_id: '{{step_1.output.user_id}}', mode: '{{const "card"}}' },
      unbound: ['note'],
    });
  });
  it('marks arguments unbound rather than guessing when no source agrees', () => {
    const odd = [run('u1', ['A1'], 'XK12QP'), run('u2', ['C3'], 'ZZ98AB')];
    odd[1]!.calls[3]!.args = { user_id: 'someone_else', mode: 'cash', note: 'x' };
    const s = learnInputs(flowSteps(), odd);
    expect(s[2]!.input_map).toEqual({});
    expect(s[2]!.unbound).toEqual(['mode', 'note', 'user_id']);
  });
  it('a flow ends with a loop whose list is unknown; a loop over a learned list goes on', () => {
    const tools = ['find_user', 'get_order', 'get_order', 'refund'].map(step);
    expect(stepsOf(tools).map((s) => s.skill_key)).toEqual(['find_user', 'get_order']);
    expect(stepsOf(tools, runs).map((s) => s.skill_key)).toEqual(['find_user', 'get_order', 'refund']);
  });
  it('with fewer than two occurrences nothing is learned: inputs stay unknown', () => {
    const s = learnInputs(flowSteps(), [runs[0]!]);
    expect(s.every((x) => x.inputs === 'unknown' && Object.keys(x.input_map).length === 0)).toBe(true);
  });
  it('evidence from events: one run per completed task, its first request and its calls', () => {
    const base = { tenant_id: 'default', agent_id: 'default', task_id: 't', session_id: 's1' };
    const ev = [
      { ...base, type: 'user_message', event_id: 'm', ts: 1, text: 'first' },
      { ...base, type: 'user_message', event_id: 'm2', ts: 2, text: 'second' },
      {
        ...base,
        type: 'tool_call',
        event_id: 'c',
        ts: 3,
        step: 0,
        tool: 'x',
        args: { a: 1 },
        observation: 2,
      },
      { ...base, type: 'task_completed', event_id: 'd', ts: 4 },
      { ...base, session_id: 's2', type: 'user_message', event_id: 'm3', ts: 5, text: 'open still' },
    ] as unknown as ToolCallsEvent[];
    expect(evidenceOf(ev)).toEqual([
      { userText: 'first', calls: [{ tool: 'x', args: { a: 1 }, observation: 2 }] },
    ]);
  });

  it('evidence is bounded: a payload over 32 KB, or past 256 KB in its session, is left out (the call stays)', () => {
    const base = { tenant_id: 'default', agent_id: 'default', task_id: 't', session_id: 's1' };
    const page = 'p'.repeat(40_000);
    const part = 'q'.repeat(30_000);
    const calls = [
      { tool: 'fetch', args: { url: 'u' }, observation: page },
      { tool: 'post', args: { body: page }, observation: { ok: true } },
      ...Array.from({ length: 10 }, (_, i) => ({ tool: 'read', args: { i }, observation: part })),
    ];
    const ev = [
      { ...base, type: 'user_message', event_id: 'm', ts: 1, text: 'go' },
      ...calls.map((c, i) => ({ ...base, type: 'tool_call', event_id: `c${i}`, ts: 2 + i, step: i, ...c })),
      { ...base, type: 'task_completed', event_id: 'd', ts: 100 },
    ] as unknown as ToolCallsEvent[];
    const [got] = evidenceOf(ev);
    // Before: every payload kept whole (the session held 700 KB).
    expect(got!.calls.map((c) => c.tool)).toEqual(calls.map((c) => c.tool));
    expect(got!.calls[0]).toEqual({ tool: 'fetch', args: { url: 'u' } });
    expect(got!.calls[1]).toEqual({ tool: 'post', observation: { ok: true } });
    // 30,002 characters an output: eight fit in 262,144 with what came before, the ninth and tenth do not.
    const kept = got!.calls.slice(2).map((c) => c.observation !== undefined);
    expect(kept).toEqual([true, true, true, true, true, true, true, true, false, false]);
    expect(got!.calls.slice(2).every((c, i) => JSON.stringify(c.args) === JSON.stringify({ i }))).toBe(true);
    const size = (v: unknown) => (v === undefined ? 0 : JSON.stringify(v).length);
    const chars = got!.calls.reduce((n, c) => n + size(c.args) + size(c.observation), 0);
    expect(chars).toBeLessThanOrEqual(262_144);
  });

  it('an argument named __proto__ is bound as any other (a key of input_map, not its prototype)', () => {
    const protoRun = (user: string, code: string): EvidenceRun => ({
      userText: `hello, my code is ${code}`,
      calls: [
        { tool: 'find_user', args: { code }, observation: { user_id: user, orders: [] } },
        { tool: 'refund', args: JSON.parse(`{"__proto__":"${user}","mode":"card"}`), observation: 'done' },
      ],
    });
    const steps = collapsedSteps(['find_user', 'refund'].map(step));
    const learned = learnInputs(steps, [
      protoRun('u1', 'XK12QP'),
      protoRun('u2', 'ZZ98AB'),
      protoRun('u3', 'MN45CD'),
    ]);
    const refund = learned[1]!;
    expect(Object.keys(refund.input_map)).toContain('__proto__');
    expect(Object.getPrototypeOf(refund.input_map)).toBe(Object.prototype);
  });
});

describe('evidence held in memory, all scopes and sessions together', () => {
  const sized = (chars: number): EvidenceRun => ({
    calls: [{ tool: 'lookup', observation: 'x'.repeat(chars - 2) }], // a JSON string: its quotes count
  });

  it('kept runs stay within FLOWS_EVIDENCE_MAX_CHARS: the oldest of any scope go first', () => {
    const book = new EvidenceBook(200, 10_000);
    // Three scopes, ten runs of 1,000 characters each, interleaved: 30,000 characters offered.
    const order: [string, EvidenceRun][] = [];
    for (let i = 0; i < 10; i++)
      for (const agent of ['a', 'b', 'c']) {
        const r = sized(1_000);
        order.push([agent, r]);
        book.add('t', agent, r);
      }
    // Before, only runs per scope were bounded: all 30 kept (200 per scope, however many scopes).
    expect(book.chars).toBe(10_000);
    const kept = new Set(['a', 'b', 'c'].flatMap((a) => [...book.runs('t', a)]));
    expect([...kept]).toHaveLength(10);
    // The newest ten, whatever their scope.
    expect(order.slice(-10).every(([, r]) => kept.has(r))).toBe(true);
    // The per-scope bound still applies, and leaves the count right.
    const small = new EvidenceBook(2, 10_000);
    for (let i = 0; i < 5; i++) small.add('t', 'a', sized(1_000));
    expect(small.runs('t', 'a')).toHaveLength(2);
    expect(small.chars).toBe(2_000);
  });

  it('open sessions past the bound lose their evidence, first opened first; their calls still count', () => {
    const t = new SessionTracker(10_000, 1_000, 5_000);
    for (const s of ['s1', 's2', 's3'])
      t.onRequest(s, { tenant: 't', agent: 'a', terms: [], shadow: null }, true);
    for (const s of ['s1', 's2', 's3'])
      for (let i = 0; i < 2; i++) t.onCall(s, { tool: 'lookup', observation: 'x'.repeat(998) });
    // 6,000 characters offered: s1 (opened first) gives its evidence up, s2 and s3 keep theirs.
    expect(t.evidenceChars).toBe(4_000);
    expect(t.get('s1')?.evidence).toBeUndefined();
    expect(t.get('s1')?.calls).toEqual(['lookup', 'lookup']);
    expect(t.get('s2')?.evidence).toHaveLength(2);
    expect(t.get('s3')?.evidence).toHaveLength(2);
    // Before, 6,000: only a session's own 256 KB bounded it (10,000 open sessions: 2.5 GB).
    expect(t.onDone('s2')?.evidence).toHaveLength(2);
    expect(t.evidenceChars).toBe(2_000);
    t.clear();
    expect(t.evidenceChars).toBe(0);
  });

  it('the request text counts, as a kept run counts it, and goes with the evidence it was kept for', () => {
    const t = new SessionTracker(10_000, 1_000, 5_000);
    const text = 'r'.repeat(2_000);
    for (const s of ['s1', 's2', 's3'])
      t.onRequest(s, { tenant: 't', agent: 'a', terms: [], shadow: null, userText: text }, true);
    // Before, 0: three open sessions' texts (64 KB each at most, 10,000 sessions) were outside the bound.
    expect(t.evidenceChars).toBe(4_000);
    expect(t.get('s1')).toMatchObject({ calls: [] });
    expect(t.get('s1')?.userText).toBeUndefined();
    expect(t.get('s1')?.evidence).toBeUndefined();
    expect(t.get('s3')?.userText).toBe(text);
    // The same size a finished run is given in the book.
    t.onCall('s3', { tool: 'lookup', observation: 'x'.repeat(998) });
    const run = t.onDone('s3')!;
    expect(evidenceChars({ userText: run.userText, calls: run.evidence! })).toBe(3_000);
    expect(t.evidenceChars).toBe(2_000);
  });
});
