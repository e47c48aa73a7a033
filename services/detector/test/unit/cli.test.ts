import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it, onTestFinished, vi } from 'vitest';
import { detectCommand } from '../../src/cli.js';
import { liveCandidates } from '../../src/core/detect.js';
import { toOp } from '../../src/core/ops.js';
import { DEFAULT_PARAMS, type DetectorParams } from '../../src/core/params.js';
import { DetectorState } from '../../src/core/state.js';
import { toolCallsEventV1 } from '../../../../schemas/index.js';

/*
 * `paver detect` is how a user checks the service's answer on exported logs: with the flags set as the service's
 * DETECTOR_* variables are, it must compute what the service's core computes with them.
 */

const HOUR = 3_600_000;
type Line = Record<string, unknown>;
const call = (task: string, step: number, tool: string, ts: number): Line => ({
  type: 'tool_call',
  event_id: `${task}-${step}`,
  session_id: `s-${task}`,
  task_id: task,
  step,
  tool,
  ts,
});
const done = (task: string, ts: number, id = `${task}-done`): Line => ({
  type: 'task_completed',
  event_id: id,
  session_id: `s-${task}`,
  task_id: task,
  ts,
});

/** What the service's core makes of `lines` with `params` (the offline file is one partition). */
function service(lines: Line[], params: DetectorParams) {
  const state = new DetectorState(params);
  for (const l of lines) state.apply(toOp(toolCallsEventV1.parse(l))!);
  const scope = { tenant: 'default', agent: 'default' };
  return liveCandidates(state.frequentStats(scope), params, state.windowRecords(scope));
}

let out = '';
let err = '';
afterEach(() => vi.restoreAllMocks());
async function detect(lines: Line[], flags: string[]): Promise<number> {
  const file = join(mkdtempSync(join(tmpdir(), 'detect-cli-')), 'events.jsonl');
  writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  out = '';
  err = '';
  vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((out += String(s)), true));
  vi.spyOn(process.stderr, 'write').mockImplementation((s) => ((err += String(s)), true));
  return detectCommand(['--input', file, ...flags]);
}

describe('paver detect: the service settings it runs with', () => {
  it('--task-idle-ms above a day remembers completed tasks as long, as the service must (retention ≥ idle)', async () => {
    const idle = 48 * HOUR;
    // Three runs of a → b → c, then a day and more of other traffic, then a late event of the first run.
    const lines = [
      ...[1, 2, 3].flatMap((i) => [
        call(`t${i}`, 0, 'a', i * 1_000),
        call(`t${i}`, 1, 'b', i * 1_000 + 1),
        call(`t${i}`, 2, 'c', i * 1_000 + 2),
        done(`t${i}`, i * 1_000 + 10),
      ]),
      call('t4', 0, 'x', 25 * HOUR),
      done('t4', 25 * HOUR + 10),
      call('t1', 3, 'w', 25 * HOUR + 100),
      done('t1', 25 * HOUR + 101, 't1-done-again'),
    ];
    // The service refuses DETECTOR_DONE_RETENTION_MS under DETECTOR_TASK_IDLE_MS: the least it runs with is equal.
    const expected = service(lines, { ...DEFAULT_PARAMS, taskIdleMs: idle, doneRetentionMs: idle });
    expect(expected.map((c) => c.tool_sequence)).toEqual([['a', 'b', 'c']]);
    expect(await detect(lines, ['--task-idle-ms', String(idle)])).toBe(0);
    expect(JSON.parse(out)).toEqual(expected);
    expect(err).toContain('2 late');

    expect(
      await detect(lines, ['--task-idle-ms', String(idle), '--done-retention-ms', String(72 * HOUR)]),
    ).toBe(0);
    expect(JSON.parse(out)).toEqual(expected);
    expect(await detect(lines, ['--task-idle-ms', String(idle), '--done-retention-ms', String(HOUR)])).toBe(
      2,
    );
    expect(err).toMatch(/--done-retention-ms .* must be ≥ --task-idle-ms/);
  });

  it('--max-task-events caps each task as DETECTOR_MAX_TASK_EVENTS does', async () => {
    const lines = [1, 2, 3].flatMap((i) => [
      ...['a', 'b', 'c', 'd'].map((tool, step) => call(`t${i}`, step, tool, i * 1_000 + step)),
      done(`t${i}`, i * 1_000 + 10),
    ]);
    const expected = service(lines, { ...DEFAULT_PARAMS, maxTaskEvents: 3 });
    expect(expected.map((c) => [c.tool_sequence, c.match_type])).toEqual([[['a', 'b', 'c'], 'exact']]);
    expect(await detect(lines, ['--max-task-events', '3'])).toBe(0);
    expect(JSON.parse(out)).toEqual(expected);
    expect(await detect(lines, ['--max-task-events', '100001'])).toBe(2);
    expect(err).toContain('--max-task-events');
  });
});

describe('paver detect: user messages', () => {
  it('reads long messages in time linear in their length (a word, 64 KB of punctuation, a word)', async () => {
    // User text: in time quadratic in its length, each such message costs seconds and these 40 minutes, a
    // batch held past its consumer's session. The child is waited for as long as any unit test (60 s), over
    // ten times what the 40 cost at quadratic time and over ten times its start-up.
    const text = 'refund' + '!'.repeat(64 * 1024 - 20) + 'order';
    const lines = Array.from({ length: 40 }, (_, i) => ({
      type: 'user_message',
      event_id: `m${i}`,
      session_id: `s${i}`,
      task_id: `t${i}`,
      ts: i,
      text,
    }));
    const file = join(mkdtempSync(join(tmpdir(), 'detect-long-')), 'events.jsonl');
    writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    const root = fileURLToPath(new URL('../../../../', import.meta.url));
    const run =
      "const { main } = await import('./cli/paver.ts'); process.exitCode = await main(process.argv.slice(1));";
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', '--input-type=module', '-e', run, 'detect', '--input', file],
      { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    onTestFinished(() => void child.kill('SIGKILL'));
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    expect(code, stderr).toBe(0);
    expect(JSON.parse(stdout)).toEqual([]);
  });
});
