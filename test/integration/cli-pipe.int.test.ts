import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/process.js';

// An offline command piped into a reader that stops early (`| head -1`) stops quietly with exit 0.
const dir = mkdtempSync(join(tmpdir(), 'paver-pipe-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// Far more output than a pipe buffers: the command is still writing when the reader goes.
const runs = readFileSync(join(ROOT, 'services/autoseq/test/fixtures/tau2-airline-30.jsonl'), 'utf8')
  .trim()
  .split('\n');
const input = join(dir, 'in.jsonl');
writeFileSync(
  input,
  Array.from({ length: 40 }, (_, i) =>
    runs.map((l) => {
      const e = JSON.parse(l) as Record<string, unknown>;
      for (const k of ['event_id', 'task_id', 'session_id'])
        if (typeof e[k] === 'string') e[k] = `${i}-${e[k] as string}`;
      // The default agent, the one examples/orchestration.yaml configures: the sequencer prints nothing for an
      // agent it has no orchestration for (events without visible_tools).
      delete e.agent;
      return JSON.stringify(e);
    }),
  )
    .flat()
    .join('\n') + '\n',
);

function firstLineThenClose(args: string[]): Promise<{ code: number | null; first: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(ROOT, 'bin/paver.js'), ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('\n')) child.stdout.destroy();
    });
    child.on('error', reject);
    child.on('exit', (code) => resolve({ code, first: out.split('\n')[0]!, stderr }));
  });
}

describe('offline commands in a pipe whose reader stops early', () => {
  for (const args of [
    ['predict'],
    ['autoseq', '--catalog', join(ROOT, 'examples/catalog.yaml')],
    ['sequence', '--config', join(ROOT, 'examples/orchestration.yaml')],
  ])
    it(`paver ${args[0]!} … | head -1: exit 0, no stack trace`, async () => {
      const r = await firstLineThenClose([...args, '--input', input]);
      expect(r.first.length).toBeGreaterThan(0);
      expect(r.stderr).not.toMatch(/EPIPE|Unhandled|at .*\.js/);
      expect(r.code).toBe(0);
    });
});

/** `paver <args>` run to its end, with `env` added to this process's environment. */
function runToEnd(
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(ROOT, 'bin/paver.js'), ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('an offline command meeting a fault no code caught (a bug)', () => {
  const preload = pathToFileURL(join(ROOT, 'test/fixtures/fault-on-first-write.mjs')).href;
  it.each([
    ['rejection', 'fixture: a rejection nobody awaits'],
    ['exception', 'fixture: a throw in a timer'],
  ])('%s: one line naming the command and the error, the stack after it, exit 1', async (fault, message) => {
    const r = await runToEnd(['predict', '--input', input], {
      FIXTURE_FAULT: fault,
      NODE_OPTIONS: `--import=${preload}`,
    });
    expect(r.code).toBe(1);
    // Before, Node's own report: a source excerpt first, the message inside the stack, its version last.
    const lines = r.stderr.split('\n');
    const at = lines.indexOf(`paver predict: internal error (a bug; please report it): ${message}`);
    expect(at, r.stderr).toBeGreaterThanOrEqual(0);
    expect(lines[at + 1]).toBe(`Error: ${message}`);
    expect(lines[at + 2]).toMatch(/^\s+at /);
    expect(r.stderr).not.toMatch(/Node\.js v\d+/);
  });
});
