import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { readEvents, type ReadStats } from '../../shared/jsonl.js';

/**
 * What exporters of agent runs (Python converters of benchmark trajectories, most of them) plausibly write
 * while following the input contract. Each of these lost lines, or every line of the file, before.
 */
const call = (over: Record<string, unknown> = {}) => ({
  type: 'tool_call',
  event_id: `s:${String(over.step ?? 0)}`,
  ts: 1,
  session_id: 's',
  task_id: 's',
  step: 0,
  tool: 'a',
  ...over,
});

async function read(text: string) {
  const file = join(mkdtempSync(join(tmpdir(), 'paver-exports-')), 'e.jsonl');
  writeFileSync(file, text);
  const stats: ReadStats = { lines: 0, bad: 0 };
  const warnings: string[] = [];
  const bad: unknown[] = [];
  const events = [];
  for await (const e of readEvents(
    file,
    stats,
    (s) => warnings.push(s),
    (raw) => bad.push(raw),
  ))
    events.push(e);
  return { events, stats, warnings, bad };
}
const lines = (...xs: unknown[]) => xs.map((x) => JSON.stringify(x)).join('\n') + '\n';

describe('readEvents: exports as converters write them', () => {
  it('skips a byte order mark at the start of the file (the first line was lost as not JSON)', async () => {
    const r = await read('\ufeff' + lines(call(), call({ step: 1 })));
    expect(r.stats.bad).toBe(0);
    expect(r.events.map((e) => e.event_id)).toEqual(['s:0', 's:1']);
  });

  it("reads Python's NaN/Infinity as null outside strings, keeps them inside, noting it once", async () => {
    const text =
      JSON.stringify(call({ observation: { v: 0, s: 'NaN or Infinity' } }))
        .replace('"v": 0', '"v": NaN')
        .replace('"v":0', '"v":NaN') +
      '\n' +
      JSON.stringify(call({ step: 1, observation: [1] })).replace('[1]', '[-Infinity, Infinity]') +
      '\n';
    const r = await read(text);
    expect(r.stats.bad).toBe(0);
    expect(r.events.map((e) => (e.type === 'tool_call' ? e.observation : undefined))).toEqual([
      { v: null, s: 'NaN or Infinity' },
      [null, null],
    ]);
    expect(r.warnings.filter((w) => w.includes('NaN/Infinity read as null'))).toHaveLength(1);
  });

  it('reads null as absent where a field may be left out; a null required field is still refused, naming line and field', async () => {
    const r = await read(
      lines(
        call({ agent_id: null, tenant_id: null, args: null, status: null, observation: null }),
        call({ step: null, event_id: 's:x' }),
        call({ step: 2 }),
      ),
    );
    expect(r.events.map((e) => e.event_id)).toEqual(['s:0', 's:2']);
    const e = r.events[0]!;
    expect([e.tenant_id, e.agent_id]).toEqual(['default', 'default']);
    expect(e.type === 'tool_call' && [e.args, e.status, e.observation]).toEqual([undefined, undefined, null]);
    expect(r.stats.bad).toBe(1);
    expect(r.warnings).toContainEqual(expect.stringMatching(/^line 2: invalid: step: /));
    expect(r.bad).toEqual([expect.objectContaining({ event_id: 's:x' })]);
  });

  it('reads args given as JSON text of an object; other text is refused naming args', async () => {
    const r = await read(
      lines(call({ args: '{"user_id": "u1", "n": [1]}' }), call({ step: 1, args: 'u1' }), call({ step: 2 })),
    );
    expect(r.events.map((e) => (e.type === 'tool_call' ? e.args : undefined))).toEqual([
      { user_id: 'u1', n: [1] },
      undefined,
    ]);
    expect(r.warnings).toContainEqual(expect.stringMatching(/^line 2: invalid: args: /));
  });

  it("reads the session as the task of a call or an end of task without a task_id; a user message stays the session's", async () => {
    const noTask = (o: Record<string, unknown>) => {
      const { task_id: _, ...rest } = o;
      return rest;
    };
    const r = await read(
      lines(
        { type: 'user_message', event_id: 's:user', ts: 0, session_id: 's', text: 'hi' },
        noTask(call()),
        { ...noTask(call({ step: 1 })), task_id: null },
        { type: 'task_completed', event_id: 's:end', ts: 2, session_id: 's' },
      ),
    );
    expect(r.stats.bad).toBe(0);
    // The message stays the session's (the contract's meaning), wherever it comes in the file.
    expect(r.events.map((e) => e.task_id)).toEqual([undefined, 's', 's', 's']);
    const withTasks = await read(
      lines(call({ task_id: 't' }), {
        type: 'user_message',
        event_id: 'u',
        ts: 3,
        session_id: 's',
        text: 'x',
      }),
    );
    expect(withTasks.events.map((e) => e.task_id)).toEqual(['t', undefined]);
  });

  it('reads a ts with a fraction (seconds from time.time()) or an ISO date-time; other ts are refused', async () => {
    const r = await read(
      lines(
        call({ ts: 1700000000.25 }),
        call({ step: 1, ts: '2024-05-01T00:00:01.500Z' }),
        call({ step: 2, ts: 'yesterday' }),
      ),
    );
    expect(r.events.map((e) => e.ts)).toEqual([1700000000, Date.parse('2024-05-01T00:00:01.500Z')]);
    expect(r.warnings).toContainEqual(expect.stringMatching(/^line 3: invalid: ts: /));
  });

  it('answers a tool_call line too long to read: refused naming the line, its ids passed on for an output line', async () => {
    const huge = call({ step: 1, observation: 'x'.repeat(1_100_000) });
    const r = await read(lines(call(), huge, call({ step: 2 })));
    expect(r.events.map((e) => e.event_id)).toEqual(['s:0', 's:2']);
    expect(r.warnings).toContainEqual(
      expect.stringMatching(/^line 2: longer than \d+ characters \(a tool_call event/),
    );
    expect(r.bad).toEqual([{ type: 'tool_call', event_id: 's:1', session_id: 's', task_id: 's' }]);
  });
});
