import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { EXIT_CONFIG } from '../../shared/config.js';
import { waitFor } from '../helpers/kafka.js';
import { startProcess } from '../helpers/process.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
// The CLI's own entry (bin/paver.js runs its build): `paver run <service>` from the sources, no build needed.
const RUN =
  "const { main } = await import('./cli/paver.ts'); process.exit(await main(process.argv.slice(1)));";

/** `paver <args>` in a child process with only `env` (and PATH); its exit code and stderr. */
async function paver(args: string[], env: Record<string, string>): Promise<{ code: number; stderr: string }> {
  try {
    await promisify(execFile)(
      process.execPath,
      ['--import', 'tsx', '--input-type=module', '-e', RUN, ...args],
      {
        cwd: root,
        env: { PATH: process.env.PATH ?? '', ...env },
      },
    );
    return { code: 0, stderr: '' };
  } catch (err) {
    const e = err as { code?: number; stderr?: string };
    return { code: e.code ?? -1, stderr: e.stderr ?? '' };
  }
}

describe('paver run with a bad environment', () => {
  it.each([
    ['detector', 'DETECTOR_TOPIC_CHECKPOINTS', 'paver.tool-calls.v1'],
    ['autoseq', 'AUTOSEQ_RULES_TOPIC', 'paver.next-actions.v1'],
    ['sequencer', 'SEQUENCER_STATE_TOPIC', 'paver.sequence-state.v1'],
    ['flows', 'FLOWS_STATE_TOPIC', 'paver.flow-selections.v1'],
    ['ingest', 'INGEST_OTLP_TOPIC', 'paver.tool-calls.v1'],
  ])(
    '%s exits 78 naming every problem, before any connection, never printing a secret',
    async (service, key, topic) => {
      const r = await paver(['run', service], {
        KAFKA_BROKERS: 'SASL_SSL://kafka:9093',
        KAFKA_SASL_USERNAME: 'svc',
        KAFKA_SASL_PASSWORD: 'kafka-hunter2',
        REDIS_URL: 'rediss://paver:redis-hunter2@redis:6380/paver',
        SCHEMA_REGISTRY_USERNAME: 'svc',
        SCHEMA_REGISTRY_PASSWORD: 'registry-hunter2',
        PAVER_RETRY_INITIAL_MS: '10000',
        [key]: topic,
      });
      expect(r.code, r.stderr).toBe(EXIT_CONFIG);
      for (const named of [
        'KAFKA_BROKERS',
        'KAFKA_SASL_MECHANISM',
        'REDIS_URL',
        'SCHEMA_REGISTRY_URL',
        'PAVER_RETRY_INITIAL_MS',
        `${key}: names the same topic`,
      ])
        expect(r.stderr).toContain(named);
      expect(r.stderr).not.toMatch(/hunter2/);
    },
  );
});

describe('offline flows commands with a bad FLOWS_* variable', () => {
  it('paver flows from-candidates says which, in one line, exit 2', async () => {
    // Before, the configuration error escaped the command: a stack trace and exit 1.
    const dir = mkdtempSync(join(tmpdir(), 'paver-cfg-'));
    writeFileSync(join(dir, 'candidates.json'), '[]');
    const r = await paver(
      [
        'flows',
        'from-candidates',
        '--input',
        join(dir, 'candidates.json'),
        '--history',
        join(root, 'examples/events.jsonl'),
      ],
      { FLOWS_EVIDENCE_RUNS: 'many' },
    );
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toContain('paver flows from-candidates: FLOWS_* settings:');
    expect(r.stderr).toContain('FLOWS_EVIDENCE_RUNS: expected an integer from 0 to 100000');
    expect(r.stderr).not.toMatch(/\n\s+at /);
  });
});

describe('paver run with a misspelt variable', () => {
  it('warns at start-up naming it and the variable meant, never its value', async () => {
    // Before, DETECTOR_MIN_LENGHT=5 was ignored without a word: the detector ran with DETECTOR_MIN_LENGTH=3.
    const p = await startProcess(['--import', 'tsx', '--input-type=module', '-e', RUN, 'run', 'detector'], {
      PATH: process.env.PATH ?? '',
      // Nothing listens there: start-up waits on Kafka, long after the warning.
      KAFKA_BROKERS: '127.0.0.1:1',
      REDIS_URL: 'redis://127.0.0.1:1',
      DETECTOR_MIN_LENGHT: '5',
      KAFKA_SASL_PASSWROD: 'hunter2-secret',
    });
    try {
      await waitFor(() => p.output().includes('KAFKA_SASL_PASSWROD'), 'the misspelling warnings', 30_000);
      expect(p.output()).toContain(
        'DETECTOR_MIN_LENGHT is not a variable this service reads (DETECTOR_MIN_LENGTH keeps its value): misspelt?',
      );
      expect(p.output()).not.toContain('hunter2');
    } finally {
      p.child.kill('SIGTERM');
      await p.exited;
    }
  });
});
