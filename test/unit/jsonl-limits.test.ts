import { spawn } from 'node:child_process';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { readFile } from 'node:fs/promises';
import { boundedLines, inputFailure, InputTooLargeError } from '../../shared/jsonl.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const event = (id: string) =>
  JSON.stringify({
    type: 'tool_call',
    event_id: id,
    ts: 1,
    session_id: 's',
    task_id: 't',
    step: 0,
    tool: 'x',
  });

/** Runs the offline reader on `chunks` as stdin, in a process with a 64 MiB heap. */
async function readUnderSmallHeap(chunks: () => Iterable<Buffer>) {
  const child = spawn(
    process.execPath,
    ['--max-old-space-size=64', '--import', 'tsx', 'test/fixtures/read-events.ts'],
    { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  // A reader that died closes the pipe: its exit code tells, not the write error.
  child.stdin.on('error', () => undefined);
  Readable.from(chunks()).pipe(child.stdin);
  const code = await exited;
  return { code, out, err };
}

describe('offline JSONL input limits', () => {
  it('a line far over the limit is refused as it streams by, never held whole (256 MiB under a 64 MiB heap)', async () => {
    const mib = Buffer.alloc(1024 * 1024, 'x');
    const r = await readUnderSmallHeap(function* () {
      yield Buffer.from(event('before') + '\n');
      for (let i = 0; i < 256; i++) yield mib;
      yield Buffer.from('\r\n' + event('after') + '\r\n');
    });
    // Before, readline buffered the whole line before its length was checked: the reader ran out of heap.
    expect(r.code, r.err.slice(-2000)).toBe(0);
    const got = JSON.parse(r.out) as { lines: number; bad: number; events: string[]; warnings: string[] };
    expect(got).toMatchObject({ lines: 3, bad: 1, events: ['before', 'after'] });
    expect(got.warnings).toEqual([`line 2: longer than ${1024 * 1024} characters`]);
  });

  it('splits any chunking of a text as readline would: \\r\\n, a last line without \\n, characters cut across chunks', async () => {
    let seed = 3;
    const r = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const alphabet = ['a', 'é', '😀', '\n', '\r\n', ' ', '{'];
    for (let n = 0; n < 500; n++) {
      const text = Array.from(
        { length: Math.floor(r() * 40) },
        () => alphabet[Math.floor(r() * alphabet.length)],
      ).join('');
      const bytes = Buffer.from(text);
      const chunks: Buffer[] = [];
      for (let i = 0; i < bytes.length;) {
        const k = 1 + Math.floor(r() * 5);
        chunks.push(bytes.subarray(i, i + k));
        i += k;
      }
      const want = text.split('\n').map((l) => (l.endsWith('\r') ? l.slice(0, -1) : l));
      if (text === '' || text.endsWith('\n')) want.pop();
      const got: (string | null)[] = [];
      for await (const line of boundedLines(Readable.from(chunks), 8)) got.push(line);
      expect(got, JSON.stringify(text)).toEqual(want.map((l) => (l.length > 8 ? null : l)));
    }
  });
});

describe('what an offline command says when its run fails', () => {
  it('"cannot read" for a read that failed (missing file, over the limit); a defect otherwise', async () => {
    const missing = await readFile('/nonexistent/x.jsonl').catch((e: unknown) => e);
    expect(inputFailure('predict', '/nonexistent/x.jsonl', missing)).toEqual({
      line: expect.stringMatching(/^paver predict: cannot read \/nonexistent\/x\.jsonl: .*ENOENT/),
      code: 2,
    });
    expect(inputFailure('detect', 'big.jsonl', new InputTooLargeError('big.jsonl', 10, 'X'))).toEqual({
      line: expect.stringMatching(
        /^paver detect: cannot read big\.jsonl: big\.jsonl is larger than 10 bytes/,
      ),
      code: 2,
    });
    // Before: a defect in processing (a TypeError) was reported as the file being unreadable.
    const defect = inputFailure(
      'savings',
      'runs.jsonl',
      new TypeError('Cannot convert undefined or null to object'),
    );
    expect(defect.line).toMatch(
      /^paver savings: failed on runs\.jsonl \(a defect in paver; please report it\): Cannot/,
    );
    expect(defect.line).not.toContain('cannot read');
    expect(defect.code).toBe(1);
  });
});
