import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { agentOrchestrationV1, type ToolCallsEvent } from '../../../../schemas/index.js';
import {
  compileAgent,
  ConfigError,
  globMatch,
  loadOrchestrationFile,
  Orchestrations,
  type Agent,
} from '../../src/core/orchestration.js';
import {
  applyEvent,
  newSession,
  SEEN,
  seenMark,
  settle,
  settledPosition,
  view,
  viewAt,
  type SessionState,
} from '../../src/core/session.js';
import { applyOrchestrationRecord, parseAgentKey } from '../../src/adapters/orchestration-feed.js';
import { orchestrationRecordV1 } from '../../../../schemas/index.js';
import { TableRejection } from '../../../../shared/kafka/table-feed.js';
import { runSequence } from '../../src/cli.js';

const TOOLS = [
  'web_search',
  'think',
  'reflect',
  'summarize',
  'save',
  'critique',
  'debate',
  'search',
  'cognitive_reframe',
  'email',
];
const agentOf = (raw: Record<string, unknown>): Agent =>
  compileAgent(agentOrchestrationV1.parse({ tools: TOOLS, ...raw }));
const research = {
  name: 'research',
  conditions: [{ type: 'message_regex', value: 'research' }],
  availableTools: { allowed: ['web_search', 'think', 'reflect', 'summarize', 'save', '*cognitive*'] },
  sequence: ['web_search', ['think', 'reflect'], 'summarize'],
};

let n = 0;
const msg = (text: string): ToolCallsEvent => ({
  type: 'user_message',
  event_id: `m${++n}`,
  ts: n,
  tenant_id: 'default',
  agent_id: 'default',
  session_id: 's',
  text,
});
const call = (tool: string, more: Partial<ToolCallsEvent> = {}): ToolCallsEvent =>
  ({
    type: 'tool_call',
    event_id: `c${++n}`,
    ts: n,
    tenant_id: 'default',
    agent_id: 'default',
    session_id: 's',
    task_id: 't',
    step: n,
    tool,
    ...more,
  }) as ToolCallsEvent;

function play(agent: Agent | undefined, events: ToolCallsEvent[], state: SessionState = newSession()) {
  const records = [];
  for (const e of events) {
    const o = applyEvent(agent, state, e);
    state = o.state;
    if (o.record) records.push(o.record);
  }
  return { records, state, last: records.at(-1)! };
}

describe('wildcards', () => {
  it.each([
    ['*cognitive*', 'cognitive_reframe', true],
    ['*cognitive*', 'meta_cognitive', true],
    ['web_*', 'web_search', true],
    ['*_search', 'web_search', true],
    ['a*b*c', 'abc', true],
    ['a*b*c', 'aXbYc', true],
    ['a*b*c', 'acb', false],
    ['ab*ba', 'aba', false],
    ['think', 'thinker', false],
    ['*', 'anything', true],
  ])('%s ~ %s = %s', (p, name, want) => expect(globMatch(p, name)).toBe(want));
});

describe('conditions and the active step', () => {
  it('message_regex activates a step, case-insensitively; the default step otherwise', () => {
    const a = agentOf({ steps: [research, { name: 'general', isDefault: true }] });
    expect(play(a, [msg('hello')]).last.active_step).toBe('general');
    expect(play(a, [msg('Please RESEARCH this')]).last).toMatchObject({
      active_step: 'research',
      expected: ['web_search'],
      allowed_tools: ['web_search'],
    });
  });
  it('tool_used activates a step after the tool appears in the history', () => {
    const a = agentOf({
      steps: [
        {
          name: 'after_search',
          conditions: [{ type: 'tool_used', value: 'web_search' }],
          availableTools: { allowed: ['summarize'] },
        },
      ],
    });
    const r = play(a, [call('think'), call('web_search')]);
    expect(r.records.map((x) => x.active_step)).toEqual([null, 'after_search']);
    expect(r.last.allowed_tools).toEqual(['summarize']);
  });
  it('sequence_match reads the ordered, non-deduplicated history: repeated tools match', () => {
    const a = agentOf({
      steps: [{ name: 'loop', conditions: [{ type: 'sequence_match', value: ['think', 'think'] }] }],
    });
    const r = play(a, [call('think'), call('web_search'), call('think'), call('think')]);
    expect(r.records.map((x) => x.active_step)).toEqual([null, null, null, 'loop']);
    const csv = agentOf({
      steps: [{ name: 'pair', conditions: [{ type: 'sequence_match', value: 'web_search, think' }] }],
    });
    expect(play(csv, [call('web_search'), call('think')]).last.active_step).toBe('pair');
  });
  it('all conditions of a step must hold; the first matching step in order wins', () => {
    const a = agentOf({
      steps: [
        {
          name: 'both',
          conditions: [
            { type: 'message_regex', value: 'go' },
            { type: 'tool_used', value: 'think' },
          ],
        },
        { name: 'msg_only', conditions: [{ type: 'message_regex', value: 'go' }] },
      ],
    });
    expect(play(a, [msg('go')]).last.active_step).toBe('msg_only');
    expect(play(a, [call('think'), msg('go')]).last.active_step).toBe('both');
  });
  it('a step with a sequence in progress stays active (sticky), unless configured otherwise', () => {
    const steps = [research, { name: 'eval', conditions: [{ type: 'message_regex', value: 'evaluate' }] }];
    const sticky = play(agentOf({ steps }), [msg('research'), call('web_search'), msg('evaluate')]);
    expect(sticky.last).toMatchObject({ active_step: 'research', sequence_index: 1 });
    const loose = play(agentOf({ steps, options: { sticky_sequences: false } }), [
      msg('research'),
      call('web_search'),
      msg('evaluate'),
    ]);
    expect(loose.last).toMatchObject({ active_step: 'eval', sequence_index: 0 });
  });
  it('moving to another step resets the index', () => {
    const steps = [
      research,
      {
        name: 'eval',
        conditions: [{ type: 'message_regex', value: 'evaluate' }],
        sequence: ['critique'],
        availableTools: { allowed: ['critique'] },
      },
    ];
    const r = play(agentOf({ steps }), [
      msg('research'),
      call('web_search'),
      call('think'),
      call('summarize'),
      msg('evaluate'),
    ]);
    expect(r.records[3]).toMatchObject({ active_step: 'research', completed: true, sequence_index: 3 });
    expect(r.last).toMatchObject({ active_step: 'eval', sequence_index: 0, expected: ['critique'] });
  });
});

describe('AgentDock compatibility', () => {
  it('sequence_match without a value matches the history tail against the step own sequence', () => {
    const review = {
      name: 'review',
      conditions: [{ type: 'sequence_match' }],
      availableTools: { allowed: ['critique', 'debate', 'think', 'reflect'] },
      sequence: ['critique', ['debate', 'think'], 'reflect'],
    };
    const a = agentOf({ steps: [review] });
    const r = play(a, [call('critique'), call('email'), call('critique'), call('think'), call('reflect')]);
    expect(r.records.map((x) => x.active_step)).toEqual([null, null, null, null, 'review']);
    // Activated by its own sequence, the step starts it again (AgentDock resets the index on a transition).
    expect(r.last).toMatchObject({ sequence_index: 0, expected: ['critique'], completed: false });
    // A group matches any member; the history is long enough for a sequence longer than the minimum.
    const long = Array.from({ length: 12 }, (_, i) => (i % 2 ? 'think' : 'critique'));
    const b = agentOf({
      steps: [{ ...review, sequence: long, availableTools: { allowed: ['critique', 'think'] } }],
    });
    expect(b.history).toBeGreaterThanOrEqual(12);
    const played = play(
      b,
      long.map((t) => call(t)),
    );
    expect(played.records.map((x) => x.active_step)).toEqual([...Array(11).fill(null), 'review']);
    // A step without a sequence: the condition never holds (AgentDock likewise), and the file is accepted.
    const none = agentOf({ steps: [{ name: 'never', conditions: [{ type: 'sequence_match' }] }] });
    expect(play(none, [call('think'), call('think')]).last.active_step).toBeNull();
  });

  it('the completing event reports the completion; a step whose condition already holds activates next', () => {
    const after = {
      name: 'after',
      conditions: [{ type: 'tool_used', value: 'summarize' }],
      availableTools: { allowed: ['save', 'email'] },
      sequence: ['save'],
    };
    const a = agentOf({ steps: [after, research] });
    const r = play(a, [msg('research'), call('web_search'), call('think'), call('summarize')]);
    expect(r.last).toMatchObject({
      active_step: 'research',
      sequence_index: 3,
      expected: [],
      completed: true,
      violation: null,
    });
    expect(r.last.allowed_tools).toContain('web_search');
    // What the next event is processed in, and what a read of the allowed tools answers meanwhile.
    const now = { ...r.state };
    settle(a, now);
    expect(view(a, now, TOOLS)).toMatchObject({
      active_step: 'after',
      sequence_index: 0,
      expected: ['save'],
    });
    const next = play(a, [call('save')], r.state);
    expect(next.last).toMatchObject({
      active_step: 'after',
      sequence_index: 1,
      completed: true,
      violation: null,
    });
  });

  it('a completed step whose own conditions still hold stays, completed, until something else matches', () => {
    const a = agentOf({ steps: [research, { name: 'general', isDefault: true }] });
    const r = play(a, [msg('research'), call('web_search'), call('think'), call('summarize'), call('save')]);
    expect(r.records.slice(3).map((x) => [x.active_step, x.completed])).toEqual([
      ['research', true],
      ['research', true],
    ]);
    expect(play(a, [msg('hello')], r.state).last).toMatchObject({ active_step: 'general', completed: false });
  });
});

describe('processTool: advance, groups, completion, violations', () => {
  const a = agentOf({ steps: [research] });
  it('advances on the expected tool and on any member of a group; completes at the end', () => {
    const r = play(a, [msg('research'), call('web_search'), call('reflect'), call('summarize')]);
    expect(r.records.map((x) => [x.sequence_index, x.expected, x.completed])).toEqual([
      [0, ['web_search'], false],
      [1, ['reflect', 'think'], false],
      [2, ['summarize'], false],
      [3, [], true],
    ]);
    expect(r.records[1]!.allowed_tools).toEqual(['reflect', 'think']);
    // After the sequence: the step's own filter, kept (the reference drops it).
    expect(r.last.allowed_tools).toEqual([
      'cognitive_reframe',
      'reflect',
      'save',
      'summarize',
      'think',
      'web_search',
    ]);
  });
  it('warn (default): a violation is recorded, the index stays', () => {
    const r = play(a, [msg('research'), call('web_search'), call('email')]);
    expect(r.last).toMatchObject({
      sequence_index: 1,
      violation: { expected: ['reflect', 'think'], used: 'email', policy: 'warn' },
    });
    expect(play(a, [msg('research'), call('web_search'), call('email'), call('think')]).last).toMatchObject({
      sequence_index: 2,
      violation: null,
    });
  });
  it('reset: the sequence restarts (and the violating tool counts when it is the first one)', () => {
    const r = agentOf({ steps: [research], options: { violation_policy: 'reset' } });
    expect(play(r, [msg('research'), call('web_search'), call('email')]).last).toMatchObject({
      sequence_index: 0,
      violation: { policy: 'reset' },
    });
    expect(
      play(r, [msg('research'), call('web_search'), call('think'), call('web_search')]).last,
    ).toMatchObject({ sequence_index: 1 });
  });
  it('hold: the step is pinned even when another step matches, until the expected tool is used', () => {
    const steps = [research, { name: 'eval', conditions: [{ type: 'message_regex', value: 'evaluate' }] }];
    const h = agentOf({ steps, options: { violation_policy: 'hold', sticky_sequences: false } });
    const r = play(h, [msg('research'), call('web_search'), call('email'), msg('evaluate')]);
    expect(r.last).toMatchObject({ active_step: 'research', sequence_index: 1 });
    expect(r.state.held).toBe(true);
    const freed = play(h, [call('think'), msg('evaluate')], r.state);
    expect(freed.last.active_step).toBe('eval');
  });

  it('hold: a configuration change that leaves nothing to wait for releases the pin', () => {
    const evalStep = { name: 'eval', conditions: [{ type: 'message_regex', value: 'evaluate' }] };
    const options = { violation_policy: 'hold', sticky_sequences: false };
    const h = agentOf({ steps: [research, evalStep], options });
    const pinned = play(h, [msg('research'), call('web_search'), call('email')]).state;
    expect(pinned).toMatchObject({ step: 'research', index: 1, held: true });
    const changed = {
      'policy no longer hold': agentOf({
        steps: [research, evalStep],
        options: { ...options, violation_policy: 'warn' },
      }),
      'sequence removed': agentOf({ steps: [{ ...research, sequence: undefined }, evalStep], options }),
      'sequence ends before the index': agentOf({
        steps: [{ ...research, sequence: ['web_search'] }, evalStep],
        options,
      }),
    };
    for (const [change, agent] of Object.entries(changed)) {
      // The held flag is stored with the session: only the expected tool cleared it, and none is expected now.
      const r = play(agent, [msg('evaluate'), call('email')], pinned);
      expect(
        r.records.map((x) => x.active_step),
        change,
      ).toEqual(['eval', 'eval']);
    }
    // The same configuration still pins it.
    expect(play(h, [msg('evaluate')], pinned).last.active_step).toBe('research');
  });
});

describe('a configuration change to the sequence of the step a session is in', () => {
  const evalStep = { name: 'eval', conditions: [{ type: 'message_regex', value: 'evaluate' }] };
  // In 'research' at index 2 of 3, held there by its own message condition.
  const before = agentOf({ steps: [research, evalStep] });
  const mid = () => play(before, [msg('research'), call('web_search'), call('think')]).state;
  const changed = {
    removed: agentOf({ steps: [{ ...research, sequence: undefined }, evalStep] }),
    shortened: agentOf({ steps: [{ ...research, sequence: ['web_search'] }, evalStep] }),
  };
  // Removed: a step without a sequence is at index 0. Shortened below the index: past its end, the sequence is
  // done (AgentDock: an index out of the sequence's bounds is no active sequence), at its length.
  const want = {
    removed: { sequence_index: 0, completed: false, expected: [] },
    shortened: { sequence_index: 1, completed: true, expected: [] },
  };
  it('every record reports an index the step has, and the state keeps it (not the old index, 2)', () => {
    expect(mid()).toMatchObject({ step: 'research', index: 2 });
    for (const [change, agent] of Object.entries(changed))
      for (const e of [msg('research'), call('email'), done()]) {
        const o = applyEvent(agent, mid(), e);
        expect(o.record, `${change}, ${e.type}`).toMatchObject({
          active_step: 'research',
          ...want[change as keyof typeof want],
        });
        if (e.type !== 'task_completed')
          expect(o.state.index, `${change}, ${e.type}`).toBe(o.record!.sequence_index);
      }
  });
  it('the allowed-tools read answers the same index', () => {
    for (const [change, agent] of Object.entries(changed)) {
      const at = settledPosition(agent, mid());
      expect(viewAt(at.step, at.index, agent.tools), change).toMatchObject({
        active_step: 'research',
        ...want[change as keyof typeof want],
      });
    }
  });
  it('a sequence added back later starts from its beginning, not from the old index', () => {
    const s = play(changed.removed, [call('email')], mid()).state;
    expect(play(before, [call('web_search')], s).last).toMatchObject({ sequence_index: 1, violation: null });
  });
});

describe('allowed tools', () => {
  it('no active step: every tool (sorted)', () => {
    expect(play(agentOf({ steps: [research] }), [call('email')]).last).toMatchObject({
      active_step: null,
      allowed_tools: [...TOOLS].sort(),
    });
  });
  it("an agent that declares no tools: the event's visible_tools are the universe", () => {
    const r = play(
      agentOf({
        tools: [],
        steps: [{ name: 'd', isDefault: true, availableTools: { allowed: ['*'], denied: ['email'] } }],
      }),
      [call('think', { visible_tools: ['email', 'b', 'a'] } as Partial<ToolCallsEvent>)],
    );
    expect(r.last.allowed_tools).toEqual(['a', 'b']);
  });
  it("an event's visible_tools (what the agent was shown: Paver's own answer) never narrow what is allowed next", () => {
    // A runtime that applies the records shows the agent what the previous record allowed, and reports it.
    const a = agentOf({ steps: [research] });
    const shown = (tool: string, allowed: string[]) =>
      call(tool, { visible_tools: allowed } as Partial<ToolCallsEvent>);
    const r = play(a, [msg('research'), shown('web_search', TOOLS)]);
    const next = play(a, [shown('think', r.last.allowed_tools)], r.state);
    // Before: the universe was ['reflect', 'think'], so summarize was unavailable and think offered again.
    expect(r.last.allowed_tools).toEqual(['reflect', 'think']);
    expect(next.last).toMatchObject({ expected: ['summarize'], allowed_tools: ['summarize'] });
    const done = play(a, [shown('summarize', next.last.allowed_tools)], next.state);
    // The completed step's own filter, over the agent's tools (before: ['summarize'] alone).
    expect(done.last).toMatchObject({
      completed: true,
      allowed_tools: ['cognitive_reframe', 'reflect', 'save', 'summarize', 'think', 'web_search'],
    });
    // The same as the allowed-tools read over the configuration's tools.
    expect(done.last.allowed_tools).toEqual(view(a, done.state, TOOLS).allowed_tools);
  });
  it('expected tool unavailable: the step filter applies (not an empty list), expected still named', () => {
    // Declared tools must hold every sequence tool; an event's visible_tools (no tools declared) need not.
    const a = agentOf({ tools: [], steps: [research] });
    const shown = { visible_tools: ['think', 'summarize', 'email'] } as Partial<ToolCallsEvent>;
    const r = play(a, [msg('research'), call('think', shown)]);
    expect(r.last).toMatchObject({
      expected: ['web_search'],
      allowed_tools: ['summarize', 'think'],
      violation: { used: 'think' },
    });
  });
  it('allowed and denied both apply', () => {
    const a = agentOf({
      steps: [
        { name: 'd', isDefault: true, availableTools: { allowed: ['*e*'], denied: ['search', 'web_*'] } },
      ],
    });
    expect(view(a, { ...newSession(), step: 'd' }, TOOLS).allowed_tools).toEqual([
      'cognitive_reframe',
      'critique',
      'debate',
      'email',
      'reflect',
      'save',
      'summarize',
    ]);
  });
  it('agents without orchestration: all tools, no step', () => {
    expect(
      play(undefined, [call('x', { visible_tools: ['b', 'a'] } as Partial<ToolCallsEvent>)]).last,
    ).toMatchObject({ active_step: null, allowed_tools: ['a', 'b'] });
  });
  it('an agent without orchestration and an event without visible_tools: no record (not "nothing allowed"), no state', () => {
    const prev = play(undefined, [call('x', { visible_tools: ['a'] } as Partial<ToolCallsEvent>)]).state;
    for (const e of [
      call('x'),
      call('x', { visible_tools: [] } as Partial<ToolCallsEvent>),
      msg('research'),
      done(),
    ]) {
      const o = applyEvent(undefined, prev, e, { partition: 0, offset: '99' });
      // Before: a record with allowed_tools [], which a runtime applying the records reads as no tool allowed,
      // where the reference allows every tool when there is no orchestration; and a state written for it.
      expect(o, e.type).toMatchObject({ record: null, duplicate: false, ignored: 'tools_unknown' });
      expect(o.state, e.type).toBe(prev);
    }
    // An agent with an orchestration is judged as before, whatever the event lists.
    expect(applyEvent(agentOf({ steps: [research] }), prev, call('x')).record).toMatchObject({
      allowed_tools: [...TOOLS].sort(),
    });
  });
});

describe('idempotency', () => {
  it('a redelivered event id changes nothing and prints nothing; a stale Kafka offset likewise', () => {
    const a = agentOf({ steps: [research] });
    const e = call('web_search');
    const s0 = play(a, [msg('research')]).state;
    const once = applyEvent(a, s0, e, { partition: 0, offset: '10' });
    expect(once.state.index).toBe(1);
    expect(applyEvent(a, once.state, e, { partition: 0, offset: '11' })).toMatchObject({
      duplicate: true,
      record: null,
    });
    const other = call('think');
    expect(applyEvent(a, once.state, other, { partition: 0, offset: '9' }).duplicate).toBe(true);
    expect(applyEvent(a, once.state, other, { partition: 0, offset: '12' }).state.index).toBe(2);
  });
  it('state stays bounded: history and seen ids', () => {
    const a = agentOf({ steps: [research] });
    const r = play(
      a,
      Array.from({ length: 100 }, () => call('think')),
    );
    expect(r.state.history.length).toBeLessThanOrEqual(8);
    expect(r.state.seen.length).toBeLessThanOrEqual(SEEN);
    expect(r.state.seen.every((m) => m.length === 12)).toBe(true);
  });
  it('a task published again under its own ids at new offsets is applied once, however long (up to SEEN events)', () => {
    const a = agentOf({ steps: [research] });
    const task = [
      msg('research'),
      ...Array.from({ length: 30 }, (_, i) => call(['web_search', 'think', 'summarize'][i % 3]!)),
    ];
    let offset = 0;
    const deliver = (state: SessionState, events: ToolCallsEvent[]) => {
      let applied = 0;
      for (const e of events) {
        const o = applyEvent(a, state, e, { partition: 0, offset: String(offset++) });
        state = o.state;
        if (!o.duplicate) applied++;
      }
      return { state, applied };
    };
    const first = deliver(newSession(), task);
    expect(first.applied).toBe(31);
    // Ingest republishes a whole task after a crash between its publish and its store: the same ids, new offsets.
    const again = deliver(first.state, task);
    // Before, each re-applied event pushed the next one's id out of a window of 4: all 31 applied again, the
    // sequence walked twice.
    expect(again.applied).toBe(0);
    expect(again.state).toEqual(first.state);
  });
  it('an event id kept as it was, in state an earlier version wrote, is still a duplicate', () => {
    const a = agentOf({ steps: [research] });
    const e = call('web_search');
    const old = { ...play(a, [msg('research')]).state, seen: [e.event_id] };
    expect(applyEvent(a, old, e).duplicate).toBe(true);
    expect(seenMark(e.event_id)).toMatch(/^[0-9a-f]{12}$/);
  });
});

describe('configuration checks', () => {
  it('refuses a sequence tool that the step does not allow, naming the step and the tools', () => {
    expect(() =>
      agentOf({ steps: [{ name: 'bad', availableTools: { allowed: ['a'] }, sequence: ['a', ['b', 'c']] }] }),
    ).toThrow(/step 'bad': sequence tool\(s\) 'b', 'c' not allowed/);
    expect(() =>
      agentOf({ steps: [{ name: 'denied', availableTools: { denied: ['x*'] }, sequence: ['xray'] }] }),
    ).toThrow(/'xray'/);
    expect(() =>
      agentOf({
        steps: [
          { name: 'wild', availableTools: { allowed: ['*cognitive*'] }, sequence: ['cognitive_reframe'] },
        ],
      }),
    ).not.toThrow();
  });
  it("refuses a sequence tool missing from the agent's declared tools, naming the agent, step and tools", () => {
    const wild = { name: 'wild', availableTools: { allowed: ['*'] }, sequence: ['a', ['z', 'b'], 'y'] };
    // Before: accepted, and the sequence never enforced ('z' and 'y' are in no universe: the step's filter instead).
    expect(() => agentOf({ tools: ['a', 'b'], steps: [wild] })).toThrow(
      /agent default\/default: step 'wild': sequence tool\(s\) 'z', 'y' not in the agent's tools/,
    );
    expect(() =>
      loadOrchestrationFile({
        agents: [{ tenant_id: 'acme', agent_id: 'bot', tools: ['a'], steps: [wild] }],
      }),
    ).toThrow(/agent acme\/bot: step 'wild': sequence tool\(s\) 'z', 'b', 'y' not in the agent's tools/);
    // No declared tools (the events' visible_tools are the universe): nothing to check against.
    expect(() => agentOf({ tools: [], steps: [wild] })).not.toThrow();
    expect(() => agentOf({ tools: ['a', 'b', 'z', 'y'], steps: [wild] })).not.toThrow();
    // A topic record: refused (dead-lettered), the previous configuration stays.
    const config = new Orchestrations();
    const record = (tools: string[]) =>
      orchestrationRecordV1.parse({
        schema_version: 1,
        tenant_id: 'acme',
        agent_id: 'bot',
        tools,
        steps: [wild],
      });
    applyOrchestrationRecord(config, record(['a', 'b', 'z', 'y']), 'acme/bot');
    expect(() => applyOrchestrationRecord(config, record(['a', 'b']), 'acme/bot')).toThrow(TableRejection);
    expect(config.get('acme', 'bot')!.tools).toEqual(['a', 'b', 'z', 'y']);
  });
  it('refuses invalid regular expressions, duplicate steps, two defaults', () => {
    expect(() =>
      agentOf({ steps: [{ name: 'r', conditions: [{ type: 'message_regex', value: '(unclosed' }] }] }),
    ).toThrow(/step 'r': message_regex/);
    expect(() => agentOf({ steps: [{ name: 'a' }, { name: 'a' }] })).toThrow(/defined twice/);
    expect(() =>
      agentOf({
        steps: [
          { name: 'a', isDefault: true },
          { name: 'b', isDefault: true },
        ],
      }),
    ).toThrow(/more than one default/);
  });
  it('file errors name the step and field; a live update that fails leaves the previous configuration', () => {
    expect(() =>
      loadOrchestrationFile({ tools: [], steps: [{ name: 'x', conditions: [{ type: 'vibes', value: 1 }] }] }),
    ).toThrow(/step 'x': conditions/);
    expect(() =>
      loadOrchestrationFile({
        agents: [
          { agent_id: 'a', steps: [{ name: 's', availableTools: { allowed: ['p'] }, sequence: ['q'] }] },
        ],
      }),
    ).toThrow(ConfigError);
    const o = new Orchestrations();
    o.set(agentOrchestrationV1.parse({ steps: [research], tools: TOOLS }));
    expect(() =>
      o.set(
        agentOrchestrationV1.parse({
          steps: [{ name: 'bad', availableTools: { allowed: ['a'] }, sequence: ['b'] }],
        }),
      ),
    ).toThrow(ConfigError);
    expect(o.get('default', 'default')!.steps[0]!.name).toBe('research');
  });
  it('an agent listed twice in the file is refused, naming it (the later one replaced the earlier silently)', () => {
    const steps = [research];
    expect(() =>
      loadOrchestrationFile({
        agents: [
          { tenant_id: 'acme', agent_id: 'a', tools: TOOLS, steps },
          { tenant_id: 'acme', agent_id: 'b', tools: TOOLS, steps },
          { tenant_id: 'acme', agent_id: 'a', tools: [], steps: [] },
        ],
      }),
    ).toThrow(/agent acme\/a is listed twice/);
    // Two entries that both leave out their ids are both default/default.
    expect(() => loadOrchestrationFile({ agents: [{ steps }, { tools: TOOLS, steps }] })).toThrow(
      /agent default\/default is listed twice/,
    );
    expect(
      loadOrchestrationFile({
        agents: [
          { agent_id: 'a', steps },
          { agent_id: 'b', steps },
        ],
      }).size,
    ).toBe(2);
  });
  it('a message crafted to make a backtracking engine run for seconds returns at once (RE2)', () => {
    const a = agentOf({
      steps: [{ name: 'evil', conditions: [{ type: 'message_regex', value: '^(a+)+$' }] }],
    });
    // With JavaScript's RegExp this input takes longer than the age of the universe; RE2 is linear.
    const r = play(a, [msg('a'.repeat(50_000) + '!')]);
    expect(r.last.active_step).toBe(null);
    expect(play(a, [msg('aaaa')]).last.active_step).toBe('evil');
  });
});

describe('orchestration topic keys', () => {
  it('tenant/agent with URI-encoded parts; anything else is not an agent key', () => {
    expect(parseAgentKey('t%2F1/a')).toEqual({ tenant: 't/1', agent: 'a' });
    expect(parseAgentKey('t/a/x')).toBeNull();
    expect(parseAgentKey(null)).toBeNull();
    expect(parseAgentKey('t/%E0%A4%A')).toBeNull();
  });

  const record = (tenant_id: string, agent_id: string) =>
    orchestrationRecordV1.parse({
      schema_version: 1,
      tenant_id,
      agent_id,
      tools: ['a'],
      steps: [{ name: 'only', isDefault: true }],
    });

  it('a record is applied only under its own key; its tombstone, under that key, removes it', () => {
    const config = new Orchestrations();
    applyOrchestrationRecord(config, record('acme/eu', 'bot'), 'acme%2Feu/bot');
    expect(config.get('acme/eu', 'bot')).toBeDefined();
    applyOrchestrationRecord(config, { kind: 'tombstone', key: 'acme%2Feu/bot' }, 'acme%2Feu/bot');
    expect(config.get('acme/eu', 'bot')).toBeUndefined();
  });

  it('refuses a record under a key that does not read as its own scope (no tombstone could remove it)', () => {
    const config = new Orchestrations();
    const keys = [
      'acme/eu/bot', // '/' not encoded: three parts, which no tombstone parses
      'bot',
      null,
      'other/bot',
    ];
    for (const key of keys)
      expect(() => applyOrchestrationRecord(config, record('acme/eu', 'bot'), key), String(key)).toThrow(
        /not the record's own key 'acme%2Feu\/bot'/,
      );
    expect(config.get('acme/eu', 'bot')).toBeUndefined();
    expect(() => applyOrchestrationRecord(config, { kind: 'tombstone', key: 'bot' }, 'bot')).toThrow(
      TableRejection,
    );
  });

  it.each([
    ['acme', 'agent:1', 'acme/agent:1'],
    ['acme', 'bot@v2', 'acme/bot@v2'],
    ['acme', 'support bot', 'acme/support bot'],
    ['acme', 'bot(v2)', 'acme/bot%28v2%29'], // Python's urllib.parse.quote(safe='')
    ['acme/eu', 'bot', 'acme%2feu/bot'],
  ])(
    'applies %s/%s under %s, another encoding of its scope (records the previous version applied stay in force)',
    (t, a, key) => {
      const config = new Orchestrations();
      applyOrchestrationRecord(config, record(t, a), key);
      expect(config.get(t, a)).toBeDefined();
      applyOrchestrationRecord(config, { kind: 'tombstone', key }, key);
      expect(config.get(t, a)).toBeUndefined();
    },
  );
});

const FEW = ['a', 'b', 'c', 'x', 'y'];
const done = (): ToolCallsEvent => ({
  type: 'task_completed',
  event_id: `d${++n}`,
  ts: n,
  tenant_id: 'default',
  agent_id: 'default',
  session_id: 's',
  task_id: 't',
});
/** What GET /sessions/{id}/allowed-tools answers for this state. */
const read = (agent: Agent, s: SessionState) => {
  const at = settledPosition(agent, s);
  return viewAt(at.step, at.index, agent.tools);
};

describe('task_completed records answer for the settled step, as the allowed-tools read does', () => {
  it('a task_completed record answers for the step the allowed-tools read answers for (new session, default step)', () => {
    const agent = agentOf({
      tools: FEW,
      steps: [{ name: 'base', isDefault: true, availableTools: { allowed: ['a'] } }],
    });
    const r = play(agent, [done()]);
    expect({ step: r.last.active_step, tools: r.last.allowed_tools }).toEqual({
      step: read(agent, r.state).active_step,
      tools: read(agent, r.state).allowed_tools,
    });
  });

  it('a task_completed after a completing call answers for the step the next event is processed in', () => {
    const agent = agentOf({
      tools: FEW,
      steps: [
        { name: 'flow', conditions: [{ type: 'sequence_match', value: ['y'] }], sequence: ['a', 'b'] },
        { name: 'base', isDefault: true, availableTools: { allowed: ['x'] } },
      ],
    });
    const r = play(agent, [call('y'), call('a'), call('b')]);
    expect(r.last).toMatchObject({ active_step: 'flow', completed: true });
    expect(read(agent, r.state).active_step).toBe('base');
    const r2 = play(agent, [done()], r.state);
    // README: "The rule then picks the next step before the next event is processed".
    expect({
      step: r2.last.active_step,
      completed: r2.last.completed,
      tools: r2.last.allowed_tools,
    }).toEqual({
      step: 'base',
      completed: false,
      tools: ['x'],
    });
  });
});

describe('paver sequence', () => {
  it('prints nothing for an event of an agent with no orchestration that lists no visible_tools, and counts it', async () => {
    const config = loadOrchestrationFile({ agent_id: 'configured', tools: TOOLS, steps: [research] });
    const of = (agent_id: string, e: ToolCallsEvent) => ({ ...e, agent_id });
    const events = [
      of('configured', msg('research')),
      of('other', call('web_search')),
      of('other', msg('hello')),
      of('other', call('think', { visible_tools: ['think', 'save'] } as Partial<ToolCallsEvent>)),
      of('configured', call('web_search')),
    ];
    const file = join(mkdtempSync(join(tmpdir(), 'paver-seq-unit-')), 'events.jsonl');
    writeFileSync(file, events.map((e) => JSON.stringify(e)).join('\n') + '\n');
    const lines: string[] = [];
    const stats = await runSequence(
      config,
      file,
      (l) => lines.push(l),
      () => undefined,
    );
    const printed = lines.map((l) => JSON.parse(l) as { agent_id: string; allowed_tools: string[] });
    // Before: five records, the two of 'other' without visible_tools saying allowed_tools [].
    expect(printed.map((r) => [r.agent_id, r.allowed_tools])).toEqual([
      ['configured', ['web_search']],
      ['other', ['save', 'think']],
      ['configured', ['reflect', 'think']],
    ]);
    expect(stats.ignored).toEqual({ tools_unknown: 2 });
  });
});
