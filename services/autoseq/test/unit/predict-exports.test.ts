import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LEARN, type LearnOptions } from '../../src/core/learn/learner.js';
import { replay } from '../../src/learn-cli.js';
import { predictLines } from '../learn-streams.js';

/**
 * `paver predict` is judged by aligning its lines with an export's tool_call lines. An export that says the
 * same thing in another plausible way (what Python converters of benchmark runs write) must give the same
 * lines; one that cannot be read in part must still give one line per tool_call, in order.
 */
describe('paver predict over exports written another way', () => {
  const fixture = join(import.meta.dirname, '../fixtures/tau2-airline-30.jsonl');
  const lowBar: LearnOptions = { ...DEFAULT_LEARN, minTrials: 5, minPrecision: 0.5 };
  const predict = async (text: string) => {
    const file = join(mkdtempSync(join(tmpdir(), 'paver-predict-')), 'e.jsonl');
    writeFileSync(file, text);
    return predictLines(file, lowBar);
  };
  const events = readFileSync(fixture, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);

  it('gives the same lines for a BOM, CRLF, null scope fields, args as JSON text, ts in seconds and no task_id', async () => {
    const want = await predict(events.map((e) => JSON.stringify(e)).join('\n') + '\n');
    expect(want.filter((l) => !l.endsWith('"proposal":null}')).length).toBeGreaterThan(10);
    const other = events.map((e) => {
      // No task_id on calls and ends (the fixture's task is its session); user messages keep theirs.
      const { task_id, agent, ...rest } = e;
      const o: Record<string, unknown> = {
        ...rest,
        ...(e.type === 'user_message' ? { task_id } : {}),
        agent_id: agent,
        tenant_id: null,
        ts: (e.ts as number) / 1000,
      };
      if (e.type === 'tool_call') o.args = JSON.stringify(e.args);
      return JSON.stringify(o);
    });
    expect(await predict('\ufeff' + other.join('\r\n') + '\r\n')).toEqual(want);
  });

  it("gives one line per tool_call, in order, for lines with Python's NaN or too long to read", async () => {
    let calls = 0;
    const text = events
      .map((e) => {
        if (e.type !== 'tool_call') return JSON.stringify(e);
        calls++;
        if (calls % 10 === 3) return JSON.stringify({ ...e, observation: 'x'.repeat(1_100_000) });
        if (calls % 10 === 5)
          return JSON.stringify({ ...e, reward: 0 }).replace('"reward": 0', '"reward": NaN');
        return JSON.stringify(e);
      })
      .join('\n');
    const out = (await predict(text)).map((l) => (JSON.parse(l) as { event_id: string }).event_id);
    expect(out).toEqual(events.filter((e) => e.type === 'tool_call').map((e) => e.event_id));
    // `savings` counts the calls it could not read too: coverage is over every call of the file, as the lines.
    const file = join(mkdtempSync(join(tmpdir(), 'paver-savings-')), 'e.jsonl');
    writeFileSync(file, text.replace('"step": 0', '"step": null'));
    const r = await replay(
      file,
      lowBar,
      null,
      () => undefined,
      () => undefined,
    );
    expect(r.bad).toBeGreaterThan(calls / 10);
    expect(r.savings.overall.tool_calls).toBe(calls);
  });
});
