import { describe, expect, it } from 'vitest';
import type { CatalogTool, ToolCallEvent } from '../../../../schemas/index.js';
import { catalogPolicyV1, catalogToolV1, nextActionRecordV1 } from '../../../../schemas/index.js';
import { sha256 } from '../../../../shared/hash.js';
import { Catalog, CatalogError, loadCatalogFile } from '../../src/core/catalog.js';
import {
  decide,
  DEFAULT_OPTIONS,
  newTaskState,
  prevCall,
  withoutArguments,
  type TaskState,
} from '../../src/core/decide.js';
import { holdsUnsafeInteger, payloadShape } from '../../src/core/shape.js';
import type { Proposal } from '../../src/core/learn/learner.js';
import { learnedExecutable, learnedRecord } from '../../src/core/learn/record.js';
import { SchemaCompiler } from '../../src/core/schema-compiler.js';

const obj = (
  properties: Record<string, unknown>,
  required: string[],
  extra: Record<string, unknown> = {},
) => ({ type: 'object', properties, required, ...extra });
const tool = (
  name: string,
  args_schema: Record<string, unknown>,
  more: Partial<CatalogTool> = {},
): CatalogTool =>
  catalogToolV1.parse({
    name,
    args_schema,
    side_effects: 'read',
    auto_seq: true,
    auto_seq_execute: true,
    ...more,
  });

function catalogOf(tools: CatalogTool[], policy: Record<string, unknown> = {}) {
  const c = new Catalog(new SchemaCompiler());
  c.loadAgent({
    tenant_id: 'default',
    agent_id: 'default',
    tools,
    policy: catalogPolicyV1.parse({ auto_seq_enabled: true, auto_seq_execute: true, ...policy }),
  });
  return c;
}

let n = 0;
const event = (observation: unknown, more: Partial<ToolCallEvent> = {}): ToolCallEvent => ({
  type: 'tool_call',
  event_id: `e${++n}`,
  ts: 1,
  tenant_id: 'default',
  agent_id: 'default',
  session_id: 's',
  task_id: 't',
  step: n,
  tool: 'triage',
  observation,
  ...more,
});

/** What the gates on the previous step read of `e` (these tests give no `visible_tools`). */
const gatesOf = (e: ToolCallEvent) => prevCall(e, undefined);

/** An active learned rule's proposal of `tool` on `args`. */
const learned = (tool: string, args: Record<string, unknown>): Proposal => ({
  tool,
  args,
  origin: 'learned',
  state: 'active',
  rule_id: 'r',
  confidence: 0.99,
  trials: 40,
  k: 1,
});
/** Whether `p` runs after `e` on a fresh task: the gates read `e` itself. */
const learnedAfter = (c: Catalog, e: ToolCallEvent, p: Proposal) =>
  learnedExecutable(e, gatesOf(e), p, c, newTaskState(), DEFAULT_OPTIONS, sha256);
/** Whether `p` runs after `e` on `task`, as `decide` left it: the gates read the last call it kept. */
const learnedOn = (c: Catalog, e: ToolCallEvent, task: TaskState, p: Proposal, again = false) =>
  learnedExecutable(e, task.prev, p, c, task, DEFAULT_OPTIONS, sha256, again);

const run = (c: Catalog, e: ToolCallEvent, state: TaskState = newTaskState(), opts = DEFAULT_OPTIONS) =>
  decide(e, c, state, opts, sha256);
const only = (c: Catalog, e: ToolCallEvent, state?: TaskState) => {
  const d = run(c, e, state);
  expect(d.records).toHaveLength(1);
  return d.records[0]!;
};

const route = obj({ route: { type: 'string' }, text: { type: 'string' } }, ['route', 'text']);
/** An observation `route` accepts. */
const good = { route: 'docs', text: 'hi' };
const orderId = obj({ order_id: { type: 'integer' } }, ['order_id']);
const cursor = obj({ cursor: { type: 'string' } }, ['cursor']);
const docState = obj(
  {
    route: { type: 'string' },
    text: { type: 'string' },
    doc_ids: { type: 'array', items: { type: 'string' } },
  },
  ['route', 'text', 'doc_ids'],
);

describe('autoseq gates (the reference order)', () => {
  const c = catalogOf([tool('init_docs', route)]);

  it('unique: exactly one visible auto-seq tool accepts the observation', () => {
    const r = only(c, event(good));
    expect(r).toMatchObject({
      event_type: 'auto_seq_detected_unique',
      tool: 'init_docs',
      candidates: ['init_docs'],
      candidate_count: 1,
      execute: true,
      arguments: good,
    });
  });
  it('skips when disabled for the agent, or when the agent has no catalog', () => {
    expect(
      only(catalogOf([tool('init_docs', route)], { auto_seq_enabled: false }), event(good)),
    ).toMatchObject({ event_type: 'auto_seq_skipped', reason: 'disabled' });
    expect(only(c, event(good, { agent_id: 'other' }))).toMatchObject({ reason: 'disabled' });
  });
  it.each([
    ['a string', 'done'],
    ['an array', [1, 2]],
    ['null', null],
    ['absent', undefined],
  ])('skips a non-mapping observation (%s)', (_, o) => {
    expect(only(c, event(o))).toMatchObject({
      event_type: 'auto_seq_skipped',
      reason: 'non_structured_observation',
    });
  });
  it('skips after a parallel action, with pending actions, and for a failed call', () => {
    expect(only(c, event(good, { next_node: 'parallel' })).reason).toBe('previous_step_parallel');
    expect(only(c, event(good, { pending_actions: 2 })).reason).toBe('pending_actions_present');
    expect(only(c, event(good, { pending_actions: 0 })).event_type).toBe('auto_seq_detected_unique');
    expect(only(c, event(good, { status: 'error' })).reason).toBe('error_observation');
  });
  it('skips a failed call that sets no status when its output says it failed, as the learned gates do', () => {
    // Before: the error object still matched the next tool's schema and was unique, executable.
    expect(only(c, event({ ...good, error: 'quota exceeded' })).reason).toBe('error_observation');
    expect(only(c, event({ ...good, success: false })).reason).toBe('error_observation');
    // A producer's status is trusted over what the output looks like.
    expect(only(c, event({ ...good, error: 'quota exceeded' }, { status: 'ok' })).event_type).toBe(
      'auto_seq_detected_unique',
    );
  });
  it('none when no tool accepts the payload', () => {
    expect(only(c, event({ route: 1, text: 'x' }))).toMatchObject({
      event_type: 'auto_seq_detected_none',
      candidates: [],
      candidate_count: 0,
    });
  });
  it('ambiguous when two accept, with the sorted candidate names', () => {
    const c2 = catalogOf([tool('zeta', route), tool('alpha', route)]);
    expect(only(c2, event(good))).toMatchObject({
      event_type: 'auto_seq_detected_ambiguous',
      candidates: ['alpha', 'zeta'],
      candidate_count: 2,
    });
  });
  it('a more specific schema removes the ambiguity (typed pipeline)', () => {
    const c2 = catalogOf([tool('init_docs', route), tool('index_docs', docState)]);
    expect(only(c2, event({ route: 'r', text: 't', doc_ids: [] })).event_type).toBe(
      'auto_seq_detected_ambiguous',
    );
    const strict = catalogOf([
      tool('init_docs', { ...route, additionalProperties: false }),
      tool('index_docs', docState),
    ]);
    expect(only(strict, event({ route: 'r', text: 't', doc_ids: [] })).tool).toBe('index_docs');
  });
});

describe('candidate gates', () => {
  it('only tools marked auto_seq are considered', () => {
    expect(only(catalogOf([tool('a', route, { auto_seq: false })]), event(good)).event_type).toBe(
      'auto_seq_detected_none',
    );
  });
  it('read-only default: write, external and unannotated tools are not candidates; the override admits them', () => {
    const tools = [
      tool('w', route, { side_effects: 'write' }),
      tool('x', route, { side_effects: 'external' }),
      tool('u', route, { side_effects: undefined }),
    ];
    expect(only(catalogOf(tools), event(good)).event_type).toBe('auto_seq_detected_none');
    expect(only(catalogOf(tools, { auto_seq_read_only_only: false }), event(good)).candidates).toEqual([
      'u',
      'w',
      'x',
    ]);
    expect(only(catalogOf([tool('p', route, { side_effects: 'pure' })]), event(good)).tool).toBe('p');
  });
  it('deny policy removes a tool', () => {
    const c = catalogOf([tool('a', route), tool('b', route)], { denied_tools: ['b'] });
    expect(only(c, event(good)).tool).toBe('a');
  });
  it("visibility: the event's visible_tools narrow the policy's, never widen them", () => {
    const c = catalogOf([tool('a', route), tool('b', route)], { visible_tools: ['a'] });
    expect(only(c, event(good)).tool).toBe('a');
    // Before: 'b' unique and executable, a tool the agent's policy keeps out, because the event named it.
    expect(only(c, event(good, { visible_tools: ['b'] })).event_type).toBe('auto_seq_detected_none');
    expect(only(c, event(good, { visible_tools: ['a', 'b'] })).tool).toBe('a');
    expect(only(c, event(good, { visible_tools: [] })).event_type).toBe('auto_seq_detected_none');
    // Without a policy list the event's list is the scope.
    const all = catalogOf([tool('a', route), tool('b', route)]);
    expect(only(all, event(good, { visible_tools: ['b'] })).tool).toBe('b');
  });
  it('a universal schema (requires nothing) is a candidate only with auto_seq_from naming the upstream tool', () => {
    const any = { type: 'object' };
    expect(only(catalogOf([tool('anything', any)]), event(good)).event_type).toBe('auto_seq_detected_none');
    const c = catalogOf([tool('anything', any, { auto_seq_from: ['triage'] })]);
    expect(only(c, event(good)).tool).toBe('anything');
    expect(only(c, event(good, { tool: 'other' })).event_type).toBe('auto_seq_detected_none');
  });
  it('a schema that requires keys through a root $ref or allOf is a candidate like a plain one', () => {
    // zod-to-json-schema's named output, and composed schemas: the model's keys are required, so the tool is
    // not "universal". Read as requiring nothing, it was never a candidate though the observation validated.
    const viaRef = { $ref: '#/definitions/RouteDecision', definitions: { RouteDecision: route } };
    expect(only(catalogOf([tool('init_docs', viaRef)]), event(good)).tool).toBe('init_docs');
    expect(only(catalogOf([tool('init_docs', { allOf: [route] })]), event(good)).tool).toBe('init_docs');
    // Still validated: a payload without the model's keys does not match.
    expect(only(catalogOf([tool('init_docs', viaRef)]), event({ text: 'hi' })).event_type).toBe(
      'auto_seq_detected_none',
    );
    // A ref to a schema that requires nothing is universal as before.
    const anyRef = { $ref: '#/$defs/Any', $defs: { Any: { type: 'object' } } };
    expect(only(catalogOf([tool('anything', anyRef)]), event(good)).event_type).toBe(
      'auto_seq_detected_none',
    );
  });
  it('auto_seq_from narrows any tool to its upstream tools', () => {
    const c = catalogOf([tool('a', route, { auto_seq_from: ['search'] })]);
    expect(only(c, event(good, { tool: 'search' })).tool).toBe('a');
    expect(only(c, event(good, { tool: 'triage' })).event_type).toBe('auto_seq_detected_none');
  });
});

describe('execution gates and arguments', () => {
  it('execute only when both the policy and the tool allow it', () => {
    expect(only(catalogOf([tool('a', route)], { auto_seq_execute: false }), event(good))).toMatchObject({
      execute: false,
    });
    expect(only(catalogOf([tool('a', route, { auto_seq_execute: false })]), event(good))).toMatchObject({
      execute: false,
    });
    const both = only(catalogOf([tool('a', route)]), event(good));
    expect(both.execute).toBe(true);
  });
  it('arguments only for an executable decision, and only when enabled', () => {
    expect(
      only(catalogOf([tool('a', route)], { auto_seq_execute: false }), event(good)).arguments,
    ).toBeUndefined();
    const d = run(catalogOf([tool('a', route)]), event(good), newTaskState(), {
      ...DEFAULT_OPTIONS,
      includeArguments: false,
    });
    expect(d.records[0]!.arguments).toBeUndefined();
  });
  it('no record carries a payload value outside arguments', () => {
    const secret = { route: 'SECRET-ROUTE', text: 'SECRET-TEXT' };
    const d = run(catalogOf([tool('a', route)], { auto_seq_execute: false }), event(secret));
    expect(JSON.stringify(d.records)).not.toMatch(/SECRET/);
  });
});

describe('payload shape', () => {
  it('hashes the type and sorted key names only', () => {
    const a = payloadShape({ b: 1, a: 2 }, sha256);
    expect(a).toMatchObject({ payload_type: 'object', payload_keys_count: 2 });
    expect(payloadShape({ a: 'x', b: 'y' }, sha256).payload_fingerprint).toBe(a.payload_fingerprint);
    expect(payloadShape({ a: 1 }, sha256).payload_fingerprint).not.toBe(a.payload_fingerprint);
    expect(payloadShape([1], sha256)).toMatchObject({ payload_type: 'array', payload_keys_count: 0 });
  });
});

describe('task state: executed, loop guard, idempotency', () => {
  it('emits auto_seq_executed when the decided tool is called with origin auto_seq', () => {
    const c = catalogOf([tool('init_docs', route)]);
    const first = run(c, event(good));
    const second = run(c, event({ done: true }, { tool: 'init_docs', origin: 'auto_seq' }), first.task);
    expect(second.records.map((r) => r.event_type)).toEqual(['auto_seq_executed', 'auto_seq_detected_none']);
    const notAuto = run(c, event({ done: true }, { tool: 'init_docs', origin: 'llm' }), first.task);
    expect(notAuto.records.map((r) => r.event_type)).toEqual(['auto_seq_detected_none']);
  });
  it('a redelivered event changes nothing and emits nothing', () => {
    const c = catalogOf([tool('init_docs', route)]);
    const e = event(good);
    const first = run(c, e);
    const again = run(c, e, first.task);
    expect(again).toMatchObject({ duplicate: true, records: [] });
    expect(again.task).toBe(first.task);
  });
  it('a redelivered batch longer than the id window: every event at or before the last applied position is skipped', () => {
    const c = catalogOf([tool('init_docs', route)]);
    // 70 events (over the 64 ids kept) alternating a decision and its auto-executed call.
    const events = Array.from({ length: 70 }, (_, i) =>
      i % 2 === 0 ? event(good) : event({ done: true }, { tool: 'init_docs', origin: 'auto_seq' }),
    );
    const at = (i: number) => ({ partition: 0, offset: String(1000 + i) });
    let task = newTaskState();
    let decided = 0;
    events.forEach((e, i) => {
      const d = decide(e, c, task, DEFAULT_OPTIONS, sha256, at(i));
      decided += d.records.length;
      task = d.task;
    });
    expect(decided).toBeGreaterThan(70);
    expect(task.at).toEqual(at(69));
    const state = task;
    events.forEach((e, i) => {
      const d = decide(e, c, task, DEFAULT_OPTIONS, sha256, at(i));
      expect(d).toMatchObject({ duplicate: true, records: [] });
      task = d.task;
    });
    expect(task).toBe(state);
    // Offsets compare as numbers, not strings ('999' < '1069').
    expect(
      decide(event(good), c, state, DEFAULT_OPTIONS, sha256, { partition: 0, offset: '999' }).duplicate,
    ).toBe(true);
    // A new event after it, or on another partition (at any offset), is decided.
    const next = decide(event(good), c, state, DEFAULT_OPTIONS, sha256, at(70));
    expect(next).toMatchObject({ duplicate: false, task: { at: at(70) } });
    expect(next.records).toHaveLength(1);
    const other = decide(event(good), c, state, DEFAULT_OPTIONS, sha256, { partition: 1, offset: '0' });
    expect(other).toMatchObject({ duplicate: false, task: { at: { partition: 1, offset: '0' } } });
  });
  it('without positions (files), the id window alone decides what is a duplicate, and no position is kept', () => {
    const c = catalogOf([tool('init_docs', route)]);
    const e = event(good);
    const first = run(c, e);
    expect('at' in first.task).toBe(false);
    expect(run(c, e, first.task).duplicate).toBe(true);
    // An old state without a position: the window still holds.
    const withPos = decide(e, c, first.task, DEFAULT_OPTIONS, sha256, { partition: 0, offset: '5' });
    expect(withPos.duplicate).toBe(true);
  });
  it('the same tool on the same payload shape twice in a row is stopped', () => {
    const c = catalogOf([tool('loop', route)]);
    const a = run(c, event(good));
    expect(a.records[0]!.tool).toBe('loop');
    const b = run(c, event(good, { tool: 'loop', origin: 'auto_seq' }), a.task);
    expect(b.records.at(-1)).toMatchObject({
      event_type: 'auto_seq_skipped',
      reason: 'loop_guard',
      tool: 'loop',
    });
  });
  it('at most maxConsecutive auto-executed steps in a row; an LLM step resets the count', () => {
    // A chain a→b→c→… of distinct tools, each accepting {kN} and returning {kN+1}.
    const tools = Array.from({ length: 8 }, (_, i) =>
      tool(`t${i}`, obj({ [`k${i}`]: { type: 'integer' } }, [`k${i}`])),
    );
    const c = catalogOf(tools);
    const opts = { ...DEFAULT_OPTIONS, maxConsecutive: 3 };
    let s = newTaskState();
    const types: string[] = [];
    for (let i = 0; i < 6; i++) {
      const d = run(
        c,
        event(
          { [`k${i}`]: i },
          { tool: i === 0 ? 'triage' : `t${i - 1}`, origin: i === 0 ? 'llm' : 'auto_seq' },
        ),
        s,
        opts,
      );
      s = d.task;
      types.push(d.records.at(-1)!.reason ?? d.records.at(-1)!.event_type);
    }
    expect(types).toEqual([
      'auto_seq_detected_unique',
      'auto_seq_detected_unique',
      'auto_seq_detected_unique',
      'loop_guard',
      'loop_guard',
      'loop_guard',
    ]);
    const reset = run(c, event({ k6: 1 }, { tool: 'x', origin: 'llm' }), s, opts);
    expect(reset.records.at(-1)!.event_type).toBe('auto_seq_detected_unique');
  });
  it('an auto-executed call in a task with no remembered call (state lost) counts as a full run: nothing executes until the agent calls again', () => {
    const tools = [
      tool('t0', obj({ k0: { type: 'integer' } }, ['k0'])),
      tool('t1', obj({ k1: { type: 'integer' } }, ['k1'])),
    ];
    const c = catalogOf(tools);
    const opts = { ...DEFAULT_OPTIONS, maxConsecutive: 3 };
    // The task's earlier calls (and its count) are gone: its next auto-executed call arrives to a fresh state.
    const lost = run(c, event({ k1: 1 }, { tool: 't0', origin: 'auto_seq' }), newTaskState(), opts);
    expect(lost.task.consecutive).toBe(3);
    expect(lost.records.at(-1)).toMatchObject({
      event_type: 'auto_seq_skipped',
      reason: 'loop_guard',
      tool: 't1',
    });
    // The same gate holds for a learned proposal made on that state.
    const p = learned('t1', { k1: 1 });
    expect(learnedExecutable(event({}), lost.task.prev, p, c, lost.task, opts, sha256).execute).toBe(false);
    // The agent's own call ends the run, as after any full one.
    const own = run(c, event({ k0: 1 }, { tool: 'x', origin: 'llm' }), lost.task, opts);
    expect(own.records.at(-1)).toMatchObject({
      event_type: 'auto_seq_detected_unique',
      tool: 't0',
      execute: true,
    });
    // A task's first call made by the agent starts from zero.
    expect(
      run(c, event({ k0: 1 }, { tool: 'x', origin: 'llm' }), newTaskState(), opts).task.consecutive,
    ).toBe(0);
  });
  it('detection-only decisions are not limited by the loop guard', () => {
    const c = catalogOf([tool('loop', route)], { auto_seq_execute: false });
    const a = run(c, event(good));
    const b = run(c, event(good, { tool: 'loop', origin: 'auto_seq' }), a.task);
    expect(b.records.at(-1)!.event_type).toBe('auto_seq_detected_unique');
  });
});

describe('schema edge cases', () => {
  const one = (schema: Record<string, unknown>, o: unknown) =>
    only(catalogOf([tool('t', schema)]), event(o)).event_type === 'auto_seq_detected_unique';
  it('additionalProperties false', () => {
    const s = obj({ a: { type: 'string' } }, ['a'], { additionalProperties: false });
    expect(one(s, { a: 'x' })).toBe(true);
    expect(one(s, { a: 'x', b: 1 })).toBe(false);
  });
  it('enums and const', () => {
    const s = obj({ route: { enum: ['docs', 'code'] } }, ['route']);
    expect(one(s, { route: 'docs' })).toBe(true);
    expect(one(s, { route: 'other' })).toBe(false);
  });
  it('nested objects and arrays', () => {
    const s = obj(
      { doc: obj({ ids: { type: 'array', items: { type: 'integer' }, minItems: 1 } }, ['ids']) },
      ['doc'],
    );
    expect(one(s, { doc: { ids: [1, 2] } })).toBe(true);
    expect(one(s, { doc: { ids: [] } })).toBe(false);
    expect(one(s, { doc: { ids: ['1'] } })).toBe(false);
  });
  it('formats (email, uri, date-time)', () => {
    const s = obj(
      {
        to: { type: 'string', format: 'email' },
        url: { type: 'string', format: 'uri' },
        at: { type: 'string', format: 'date-time' },
      },
      ['to', 'url', 'at'],
    );
    expect(one(s, { to: 'a@b.co', url: 'https://x.y/z', at: '2026-11-22T10:00:00Z' })).toBe(true);
    expect(one(s, { to: 'nope', url: 'https://x.y/z', at: '2026-11-22T10:00:00Z' })).toBe(false);
    expect(one(s, { to: 'a@b.co', url: 'not a uri', at: '2026-11-22T10:00:00Z' })).toBe(false);
  });
  it('a catastrophic pattern runs in linear time (RE2): the decision returns at once', () => {
    const s = obj({ a: { type: 'string', pattern: '^(a+)+$' } }, ['a']);
    const c = catalogOf([tool('t', s)]);
    const r = only(c, event({ a: 'a'.repeat(5000) + '!' }));
    expect(r.event_type).toBe('auto_seq_detected_none');
    expect(only(c, event({ a: 'aaaa' })).event_type).toBe('auto_seq_detected_unique');
  });
});

describe('catalog loading and reload', () => {
  /** What every catalog-topic record of the default agent starts with. */
  const scoped = { schema_version: 1, tenant_id: 'default', agent_id: 'default' } as const;
  it('names the agent, the tool and the field in file errors, all at once', () => {
    const bad = {
      agents: [
        {
          agent_id: 'bot',
          tools: [
            { name: 'ok', args_schema: {} },
            { name: 'broken', args_schema: {}, side_effects: 'sometimes' },
            { args_schema: {} },
          ],
        },
      ],
    };
    expect(() => loadCatalogFile(bad, new SchemaCompiler())).toThrow(CatalogError);
    try {
      loadCatalogFile(bad, new SchemaCompiler());
    } catch (err) {
      expect(err instanceof Error ? err.message : String(err)).toMatch(
        /agent default\/bot, tool 'broken': side_effects/,
      );
      expect(err instanceof Error ? err.message : String(err)).toMatch(/agent default\/bot, tool #2: name/);
    }
  });
  it('rejects a schema that does not compile, naming the tool', () => {
    const bad = {
      agents: [
        {
          tools: [
            { name: 'weird', args_schema: { type: 'object', properties: { a: { type: 'no-such-type' } } } },
          ],
        },
      ],
    };
    expect(() => loadCatalogFile(bad, new SchemaCompiler())).toThrow(/tool 'weird': args_schema/);
  });
  it('a topic update changes decisions; a bad one throws and leaves the catalog as it was', () => {
    const c = catalogOf([tool('a', route)]);
    expect(only(c, event(good)).tool).toBe('a');
    c.apply({ ...scoped, kind: 'tool', tool: tool('b', route) });
    expect(only(c, event(good)).event_type).toBe('auto_seq_detected_ambiguous');
    expect(() => c.apply({ ...scoped, kind: 'tool', tool: tool('b', { type: 'nope' }) })).toThrow(
      CatalogError,
    );
    expect(only(c, event(good)).event_type).toBe('auto_seq_detected_ambiguous');
    c.apply({ ...scoped, kind: 'tool_removed', name: 'a' });
    expect(only(c, event(good)).tool).toBe('b');
    c.apply({ ...scoped, kind: 'policy', policy: catalogPolicyV1.parse({ auto_seq_enabled: false }) });
    expect(only(c, event(good)).reason).toBe('disabled');
  });
  it('prunes by required keys: 1,000 tools, only the matching few validated', () => {
    const tools = Array.from({ length: 1000 }, (_, i) =>
      tool(`t${i}`, obj({ [`k${i}`]: { type: 'string' } }, [`k${i}`])),
    );
    const c = catalogOf(tools);
    expect(
      c
        .scope('default', 'default')!
        .preselect(new Set(['k7', 'zzz']))
        .map((t) => t.spec.name),
    ).toEqual(['t7']);
    expect(only(c, event({ k7: 'x' })).tool).toBe('t7');
  });
});

describe('integers JSON parsing may have rounded', () => {
  const c = catalogOf([tool('get_order', orderId)]);
  it('an output holding one is proposed, never executed: the runtime would call the tool with another id', () => {
    // `{"order_id":1234567890123456789}` on the wire parses to 1234567890123456800.
    const wire = JSON.parse('{"order_id":1234567890123456789}') as Record<string, unknown>;
    const r = only(c, event(wire));
    expect(r).toMatchObject({ event_type: 'auto_seq_detected_unique', tool: 'get_order', execute: false });
    expect(r.arguments).toBeUndefined();
    expect(only(c, event({ order_id: 12345 }))).toMatchObject({
      execute: true,
      arguments: { order_id: 12345 },
    });
  });
  it('the same gate for learned proposals, at any depth; floats and safe integers pass', () => {
    const e = event({});
    expect(learnedAfter(c, e, learned('get_order', { order_id: 12 })).execute).toBe(true);
    expect(learnedAfter(c, e, learned('get_order', { q: { ids: [1, 2 ** 60] } })).execute).toBe(false);
    expect(holdsUnsafeInteger({ a: [1.5, -(2 ** 53) + 1, 1e-300, 'x'] })).toBe(false);
    expect(holdsUnsafeInteger({ a: [1e21] })).toBe(true);
  });
});

describe("learned execution keeps the reference's gates on the previous step", () => {
  const c = catalogOf([tool('get_order', orderId)]);
  const active = () => learned('get_order', { order_id: 12 });
  /** Whether the active proposal runs after a call made as `more` says. */
  const exec = (more: Partial<ToolCallEvent>) => learnedAfter(c, event({}, more), active());

  it('an active proposal after a parallel action, or with actions already queued, is published but not executed', () => {
    expect(exec({}).execute).toBe(true);
    // The typed decider skips these (previous_step_parallel, pending_actions_present); the learned one executed.
    expect(exec({ next_node: 'parallel' })).toEqual({ execute: false, task: newTaskState() });
    expect(exec({ pending_actions: 2 })).toEqual({ execute: false, task: newTaskState() });
    expect(exec({ pending_actions: 0, next_node: 'other' }).execute).toBe(true);
  });

  it('an active proposal after a call that failed is published but not executed, as the typed decider skips it', () => {
    expect(exec({ status: 'ok' }).execute).toBe(true);
    // The typed decider skips it (error_observation): what the failed call returned is no ground to run on.
    expect(exec({ status: 'error' })).toEqual({ execute: false, task: newTaskState() });
    // Without a status, an output that says it failed, as the learner judges it (its `!failed` contexts): the
    // text, a flag, the JSON text of one. Before: executable. A producer's `ok` is trusted, as by the learner.
    for (const observation of ['Error: user not found', { error: 'no such order' }, '{"ok": false}'])
      expect(exec({ observation }).execute, JSON.stringify(observation)).toBe(false);
    expect(exec({ observation: { order: 'W1' } }).execute).toBe(true);
    expect(exec({ status: 'ok', observation: 'Error: user not found' }).execute).toBe(true);
  });

  it("the event's visible_tools narrow the policy's for a learned proposal too, never widen them", () => {
    const execUnder = (policy: Record<string, unknown>, visible_tools?: string[]) => {
      const cat = catalogOf([tool('get_order', orderId)], policy);
      const e = event({}, visible_tools ? { visible_tools } : {});
      return learnedOn(cat, e, run(cat, e).task, active()).execute;
    };
    expect(execUnder({}, ['get_order'])).toBe(true);
    expect(execUnder({ visible_tools: ['get_order'] })).toBe(true);
    expect(execUnder({ visible_tools: ['get_order'] }, ['get_order', 'other'])).toBe(true);
    expect(execUnder({ visible_tools: ['get_order'] }, ['other'])).toBe(false);
    // Before: executable, the event's list replacing the policy's that keeps the tool out.
    expect(execUnder({ visible_tools: ['other'] }, ['get_order'])).toBe(false);
  });

  it('the task keeps what the gates read of its last call, for a decision after a later user message', () => {
    const d = run(c, event('Error: not found', { tool: 'lookup' }));
    expect(d.task.prev).toEqual({ tool: 'lookup', held: true });
    const v = run(
      c,
      event({ a: 1 }, { tool: 'search', visible_tools: ['get_order', 'not_in_catalog'] }),
      d.task,
    );
    expect(v.task.prev).toEqual({ tool: 'search', visible: ['get_order'] });
    // Nothing known of the last call (state written before it was kept, or lost): nothing runs.
    expect(
      learnedExecutable(event({}), undefined, active(), c, newTaskState(), DEFAULT_OPTIONS, sha256).execute,
    ).toBe(false);
  });
});

describe('the loop guard holds across deciders, on the payload shape', () => {
  const c = catalogOf([tool('page', cursor)]);
  it('a learned proposal does not run the tool the typed loop guard just stopped, on a payload of the same shape', () => {
    const first = run(c, event({ cursor: 'a' }, { tool: 'search' }));
    expect(first.records.at(-1)).toMatchObject({ tool: 'page', execute: true });
    const again = event({ cursor: 'b' }, { tool: 'page', origin: 'auto_seq' });
    const d = run(c, again, first.task);
    expect(d.records.at(-1)).toMatchObject({ event_type: 'auto_seq_skipped', reason: 'loop_guard' });
    // Before: the learned proposal that replaced the skipped record ran `page` again (its fingerprint, of the
    // values, never equalled the typed one), the loop bounded only by AUTOSEQ_MAX_CONSECUTIVE.
    expect(learnedOn(c, again, d.task, learned('page', { cursor: 'b' })).execute).toBe(false);
  });
  it('learned after learned: the same tool on arguments with the same key names is not run twice in a row', () => {
    const e1 = event({}, { tool: 'search' });
    const g1 = learnedOn(c, e1, run(c, e1).task, learned('page', { cursor: 'a' }));
    expect(g1.execute).toBe(true);
    const e2 = event({}, { tool: 'page', origin: 'auto_seq', args: { cursor: 'a' } });
    const d2 = run(c, e2, g1.task);
    expect(d2.records[0]).toMatchObject({ event_type: 'auto_seq_executed', tool: 'page' });
    expect(learnedOn(c, e2, d2.task, learned('page', { cursor: 'x' })).execute).toBe(false);
    // Another tool, or the agent's own call in between, runs.
    const e3 = event({}, { tool: 'search', origin: 'llm' });
    const d3 = run(c, e3, d2.task);
    expect(learnedOn(c, e3, d3.task, learned('page', { cursor: 'x' })).execute).toBe(true);
  });
});

describe('after a later user message', () => {
  const c = catalogOf([tool('page', cursor)]);
  it('the record that replaces an executable decision of the same step keeps it executable', () => {
    const e = event({}, { tool: 'search' });
    const g = learnedOn(c, e, run(c, e).task, learned('page', { cursor: 'a' }));
    expect(g.execute).toBe(true);
    // The message's record proposes the same call (no rule reads what the user said), or the same tool on
    // arguments of the same shape (a rule that does): the same decision again, not the tool run twice in a row.
    // Before: execute false, the runtime (acting on the newest record) asked the model for an obvious step.
    for (const args of [{ cursor: 'a' }, { cursor: 'said' }]) {
      const again = learnedOn(c, e, g.task, learned('page', args), true);
      expect(again.execute).toBe(true);
      expect(again.task).toMatchObject({ consecutive: g.task.consecutive, pending: 'page' });
    }
    // Once the tool ran (its auto-executed call), the guard holds for the decision after it, message or not.
    const ran = event({}, { tool: 'page', origin: 'auto_seq', args: { cursor: 'a' } });
    const d = run(c, ran, g.task);
    expect(learnedOn(c, ran, d.task, learned('page', { cursor: 'b' }), true).execute).toBe(false);
  });
});

describe('a tool not marked auto_seq', () => {
  it('is never executed by a learned decision either (the reference considers only auto_seq tools)', () => {
    const c = catalogOf([tool('page', cursor, { auto_seq: false, auto_seq_execute: true })]);
    const e = event({}, { tool: 'search' });
    // Before: executed, though the operator opted the tool out of auto-seq.
    expect(learnedAfter(c, e, learned('page', { cursor: 'a' }))).toEqual({
      execute: false,
      task: newTaskState(),
    });
  });
});

describe('auto_seq_from', () => {
  it('narrows learned execution to the upstream tools it names, as it narrows typed candidates', () => {
    const c = catalogOf([tool('page', cursor, { auto_seq_from: ['search'] })]);
    const after = (tool: string) =>
      learnedAfter(c, event({}, { tool }), learned('page', { cursor: 'a' })).execute;
    expect(after('search')).toBe(true);
    // Before: true, after any tool.
    expect(after('delete_account')).toBe(false);
  });
});

describe('a learned proposal over the output size limit', () => {
  it('is published as no decision for its event, not left out (the runtime would act on the record before)', () => {
    const c = catalogOf([tool('page', cursor)]);
    const e = event({ big: 'x' }, { tool: 'search' });
    const shape = payloadShape(e.observation, sha256);
    const p = learned('page', { cursor: 'y'.repeat(5000) });
    const rec = learnedRecord(e, shape, p, learnedAfter(c, e, p).execute);
    expect(rec).toMatchObject({ origin: 'learned', execute: true });
    // Before: null, and the sink left the record out: the session's newest record stayed the previous call's.
    const fit = withoutArguments(rec);
    expect(fit).toEqual({
      schema_version: 1,
      tenant_id: 'default',
      agent_id: 'default',
      session_id: 's',
      task_id: 't',
      event_id: e.event_id,
      step: e.step,
      ts: 1,
      event_type: 'auto_seq_detected_none',
      candidates: [],
      candidate_count: 0,
      ...shape,
    });
    expect(nextActionRecordV1.safeParse(fit).success).toBe(true);
  });
});
