import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it, vi } from 'vitest';
import { publish } from '../../cli/publish.js';

let err = '';
beforeEach(() => {
  err = '';
  vi.spyOn(process.stderr, 'write').mockImplementation((s: string | Uint8Array) => {
    err += String(s);
    return true;
  });
});
afterEach(() => vi.restoreAllMocks());

// No broker at this address: a check made after connecting would answer 69 (no broker), not 2.
const env = { KAFKA_BROKERS: '127.0.0.1:1' };

it('paver publish says why --input cannot be read, a directory included, before connecting (exit 2)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'paver-publish-'));
  const missing = join(dir, 'missing.jsonl');
  // Before: 'cannot read --input FILE' with no reason.
  expect(await publish({ input: missing, env })).toBe(2);
  expect(err).toBe(
    `paver publish: cannot read --input ${missing}: ENOENT: no such file or directory, access '${missing}'\n`,
  );
  err = '';
  // Before: a directory passed, the command connected and failed with 'failed after 0 events: EISDIR' (or 69).
  expect(await publish({ input: dir, env })).toBe(2);
  expect(err).toBe(`paver publish: cannot read --input ${dir}: it is a directory\n`);
});

it('paver publish refuses a --topic that is not a topic name, as the topic variables do, before connecting (exit 2)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'paver-publish-'));
  const input = join(dir, 'events.jsonl');
  writeFileSync(input, '{}\n');
  // Before: '' was taken, and the command connected (69 here, no broker; with one, the send was refused).
  for (const bad of ['', '.', 'a b', 'x'.repeat(250)]) {
    err = '';
    expect(await publish({ input, topic: bad, env })).toBe(2);
    expect(err).toBe(
      'paver publish: --topic: expected a Kafka topic name (1 to 249 of [a-zA-Z0-9._-], not . or ..)\n',
    );
  }
});

it('paver publish refuses a bad --tenant or --agent as a usage error (exit 2), as every other command does a bad flag', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'paver-publish-'));
  const input = join(dir, 'events.jsonl');
  writeFileSync(input, '{}\n');
  // Before: exit 78, the code of a bad environment (EX_CONFIG), for a flag.
  for (const flag of ['tenant', 'agent'] as const) {
    err = '';
    expect(await publish({ input, [flag]: 'a\tb', env })).toBe(2);
    expect(err).toBe(
      `paver publish: --${flag}: must not contain control characters or unpaired surrogates\n`,
    );
    err = '';
    expect(await publish({ input, [flag]: 'x'.repeat(257), env })).toBe(2);
    expect(err).toMatch(new RegExp(`^paver publish: --${flag}: .*256`));
  }
});

it('paver publish takes every --tenant or --agent the contract takes (a space, any printable character)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'paver-publish-'));
  const input = join(dir, 'events.jsonl');
  writeFileSync(input, '{}\n');
  // Past the flag checks: it connects (69 here, no broker). Before, 2: only 1-128 of [A-Za-z0-9._:-] were taken.
  expect(await publish({ input, tenant: 'acme corp', agent: 'agent/é', env })).toBe(69);
  expect(err).not.toMatch(/--tenant|--agent/);
});
