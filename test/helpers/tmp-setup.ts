import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A test run's temporary files (input files, flows files, the local stack's data) in one folder, removed at the
 * end of the run: tests write them with `mkdtemp` under `os.tmpdir()`, which the test processes started after
 * this read from TMPDIR.
 */
export default function setup(): () => void {
  const dir = mkdtempSync(join(tmpdir(), 'paver-test-run-'));
  const before = process.env.TMPDIR;
  process.env.TMPDIR = dir;
  return () => {
    if (before === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = before;
    rmSync(dir, { recursive: true, force: true });
  };
}
