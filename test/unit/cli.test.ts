import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { readEvents, type ReadStats } from '../../shared/jsonl.js';
import { autoseqEnvSchema } from '../../services/autoseq/src/config.js';
import { detectorEnvSchema } from '../../services/detector/src/config.js';
import { flowsEnvSchema } from '../../services/flows/src/config.js';
import { decodeLimitsFromEnv, ingestEnvSchema } from '../../services/ingest/src/config.js';
import { decodeOtlp } from '../../services/ingest/src/adapters/otlp-decode.js';
import { waitFor } from '../helpers/kafka.js';

// The commands that start processes or talk to Kafka record their calls instead: a --help that acted shows
// up as a call (and would otherwise start Kafka in a unit test).
const acted = vi.hoisted(() => ({ calls: [] as { what: string; args: unknown }[] }));
vi.mock('../../deploy/local/stack.js', () => ({
  startStack: (args: unknown) => {
    acted.calls.push({ what: 'stack', args });
    return Promise.reject(new Error('stack must not start in this test'));
  },
}));
vi.mock('../../cli/dev.js', () => ({
  dev: (args: unknown) => (acted.calls.push({ what: 'dev', args }), Promise.resolve(0)),
}));
vi.mock('../../cli/publish.js', () => ({
  publish: (args: unknown) => (acted.calls.push({ what: 'publish', args }), Promise.resolve(0)),
}));

const { main } = await import('../../cli/paver.js');

const root = fileURLToPath(new URL('../../', import.meta.url));
const EVENTS = join(root, 'examples/events.jsonl');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string };

let out = '';
let err = '';
beforeEach(() => {
  out = '';
  err = '';
  acted.calls.length = 0;
  vi.spyOn(process.stdout, 'write').mockImplementation((s: string | Uint8Array) => {
    out += String(s);
    return true;
  });
  vi.spyOn(process.stderr, 'write').mockImplementation((s: string | Uint8Array) => {
    err += String(s);
    return true;
  });
});
afterEach(() => vi.restoreAllMocks());

const withStdin = (text: string) =>
  vi.spyOn(process, 'stdin', 'get').mockReturnValue(Readable.from([text]) as typeof process.stdin);

const COMMANDS = [
  ['run'],
  ['dev'],
  ['stack'],
  ['publish'],
  ['gen-schemas'],
  ['detect'],
  ['autoseq'],
  ['predict'],
  ['savings'],
  ['sequence'],
  ['select'],
  ['otel'],
  ['flows'],
  ['flows', 'from-candidates'],
  ['flows', 'replay'],
  ['flows', 'list'],
  ['flows', 'show'],
  ['flows', 'promote'],
  ['flows', 'reject'],
  ['flows', 'registry'],
];

function schemaFiles() {
  const dir = join(root, 'schemas/json');
  return readdirSync(dir)
    .sort()
    .map((f) => {
      const p = join(dir, f);
      return `${f}:${statSync(p).mtimeMs}:${createHash('sha256').update(readFileSync(p)).digest('hex')}`;
    });
}

// The machine running the suite is shared and slow; these read the example stream several times.
describe('paver CLI conventions', { timeout: 120_000 }, () => {
  it('--version prints the package version', async () => {
    expect(await main(['--version'])).toBe(0);
    expect(out.trim()).toBe(pkg.version);
    out = '';
    expect(await main(['-V'])).toBe(0);
    expect(out.trim()).toBe(pkg.version);
  });

  it.each(COMMANDS.map((c) => [c.join(' '), c] as const))(
    '%s --help and -h print usage, exit 0 and do nothing',
    async (_name, cmd) => {
      const before = schemaFiles();
      for (const flag of ['--help', '-h']) {
        out = '';
        // Required options and arguments missing on purpose: help wins over them.
        expect(await main([...cmd, flag]), `${cmd.join(' ')} ${flag}`).toBe(0);
        expect(out).toContain(`Usage: paver ${cmd.join(' ')}`);
      }
      expect(await main(['help', ...cmd])).toBe(0);
      expect(acted.calls).toEqual([]);
      expect(schemaFiles()).toEqual(before);
    },
  );

  it('an unknown flag is one usage line on stderr and exit 2, before anything runs', async () => {
    for (const argv of [
      ['detect', '--input', EVENTS, '--min-lenght', '3'],
      ['stack', '--detach'],
      ['gen-schemas', '--out', 'x'],
      ['dev', '--services', 'detector'],
      ['flows', 'replay', '--input', EVENTS, '--bogus'],
    ]) {
      err = '';
      expect(await main(argv), argv.join(' ')).toBe(2);
      expect(err.trim().split('\n'), argv.join(' ')).toHaveLength(1);
      expect(err).toMatch(/unknown option '--[\w-]+'.*usage: paver /);
    }
    expect(err).toContain('paver flows replay:');
    expect(acted.calls).toEqual([]);
    err = '';
    expect(await main(['nope'])).toBe(2);
    expect(err).toContain("unknown command 'nope'");
  });

  it('a missing input or configuration file: every offline command names it, says it cannot read it, exit 2', async () => {
    const missing = join(mkdtempSync(join(tmpdir(), 'paver-cli-')), 'missing.jsonl');
    const candidates = join(mkdtempSync(join(tmpdir(), 'paver-cli-')), 'candidates.json');
    writeFileSync(candidates, '[]');
    // Before: 1 for an input file, 2 for a configuration file (and 1 for flows replay's and from-candidates').
    for (const argv of [
      ['detect', '--input', missing],
      ['autoseq', '--catalog', join(root, 'examples/catalog.yaml'), '--input', missing],
      ['autoseq', '--catalog', missing, '--input', EVENTS],
      ['predict', '--input', missing],
      ['savings', '--input', missing],
      ['sequence', '--config', join(root, 'examples/orchestration.yaml'), '--input', missing],
      ['sequence', '--config', missing, '--input', EVENTS],
      ['select', '--flows', missing, '--query', 'refund'],
      ['otel', '--input', missing],
      ['flows', 'replay', '--input', missing],
      ['flows', 'replay', '--input', EVENTS, '--flows', missing],
      ['flows', 'from-candidates', '--input', missing],
      ['flows', 'from-candidates', '--input', candidates, '--history', missing],
    ]) {
      err = '';
      expect(await main(argv), argv.join(' ')).toBe(2);
      expect(err, argv.join(' ')).toContain(`cannot read ${missing}: `);
    }
    // A directory given as a file: before, flows replay said a bare 'EISDIR: illegal operation on a directory'.
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-dir-'));
    for (const argv of [
      ['detect', '--input', dir],
      ['predict', '--input', dir],
      ['flows', 'replay', '--input', dir],
      ['flows', 'replay', '--input', EVENTS, '--flows', dir],
    ]) {
      err = '';
      expect(await main(argv), argv.join(' ')).toBe(2);
      expect(err, argv.join(' ')).toContain(`cannot read ${dir}: `);
    }
  });

  it('dev and publish get their options; publish --input - reads stdin', async () => {
    expect(await main(['dev', '--service', 'detector', '--service', 'flows'])).toBe(0);
    expect(
      await main(['publish', '--input', '-', '--topic', 't', '--tenant', 'acme', '--agent', 'support']),
    ).toBe(0);
    expect(acted.calls).toEqual([
      { what: 'dev', args: expect.objectContaining({ services: ['detector', 'flows'] }) },
      {
        what: 'publish',
        args: { input: '-', topic: 't', tenant: 'acme', agent: 'support' },
      },
    ]);
  });

  it('dev --service with a name that is not a service: one usage line, exit 2, before the stack starts', async () => {
    // Before: dev started the stack (Kafka: a minute), then died on a TypeError with a stack trace, exit 1.
    err = '';
    expect(await main(['dev', '--service', 'detector', '--service', 'detectr'])).toBe(2);
    expect(err.trim().split('\n')).toHaveLength(1);
    expect(err).toContain("paver dev: unknown service 'detectr'");
    expect(err).toContain('detector, autoseq, sequencer, flows, ingest');
    expect(acted.calls).toEqual([]);
  });

  it('dev --service given twice runs that service once', async () => {
    // Before: two detectors on one HTTP port, the second restarted for ever, and the first left out of the
    // services dev stops (it was replaced in dev's table), still running while the stack was stopped.
    expect(await main(['dev', '--service', 'detector', '--service', 'flows', '--service', 'detector'])).toBe(
      0,
    );
    expect(acted.calls).toEqual([
      { what: 'dev', args: expect.objectContaining({ services: ['detector', 'flows'] }) },
    ]);
  });

  it('paver stack: a stack that does not start is its message on stderr and exit 1, not a stack trace', async () => {
    // Before: the error left main() and Node printed it with its stack trace (java or mvn missing, a broker
    // that did not become ready).
    expect(await main(['stack'])).toBe(1);
    expect(err).toBe('paver stack: the local stack did not start: stack must not start in this test\n');
    expect(out).toBe('');
  });

  it("'-' reads stdin; output is JSONL by default and indented with --pretty", async () => {
    const text = readFileSync(EVENTS, 'utf8');
    withStdin(text);
    expect(await main(['detect', '--input', '-'])).toBe(0);
    const lines = out.trim().split('\n');
    expect(lines).toHaveLength(1);
    const fromStdin = JSON.parse(lines[0]!) as unknown[];
    expect(fromStdin.length).toBeGreaterThan(0);
    out = '';
    expect(await main(['detect', '--input', EVENTS, '--pretty'])).toBe(0);
    expect(out.split('\n').length).toBeGreaterThan(10);
    expect(JSON.parse(out)).toEqual(fromStdin);

    out = '';
    withStdin(text);
    expect(
      await main(['sequence', '--config', join(root, 'examples/orchestration.yaml'), '--input', '-']),
    ).toBe(0);
    const records = out.trim().split('\n');
    expect(records.length).toBeGreaterThan(100);
    for (const r of records) expect(() => JSON.parse(r) as unknown).not.toThrow();

    out = '';
    expect(
      await main(['select', '--flows', join(root, 'examples/flows.yaml'), '--query', 'refund my order 42']),
    ).toBe(0);
    expect(out.trim().split('\n')).toHaveLength(1);
    // No model configured: the path says the top-ranked candidate decided, not that something failed.
    expect(JSON.parse(out)).toMatchObject({ path: expect.stringMatching(/^(top_ranked|fast_path)$/) });
  });

  it('paver select takes its defaults from the service\u2019s FLOWS_* settings; a flag wins', async () => {
    const flows = join(root, 'examples/flows.yaml');
    const run = async (...flags: string[]) => {
      out = '';
      expect(await main(['select', '--flows', flows, '--query', 'refund my order 42', ...flags])).toBe(0);
      return (JSON.parse(out) as { chosen: { name: string }[] }).chosen.map((c) => c.name);
    };
    expect(await run()).toEqual(['refund_order']);
    vi.stubEnv('FLOWS_SCORE_FLOOR', '1000');
    try {
      // The service would choose nothing under that floor: so does the offline command.
      expect(await run()).toEqual([]);
      expect(await run('--score-floor', '0')).toEqual(['refund_order']);
    } finally {
      vi.unstubAllEnvs();
    }
  });

  it('--strict exits 1 on bad lines; without it the count still goes to stderr', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-'));
    const file = join(dir, 'events.jsonl');
    writeFileSync(file, `not json\n${readFileSync(EVENTS, 'utf8')}{"type":"tool_call"}\n`);
    const catalog = join(root, 'examples/catalog.yaml');
    for (const argv of [
      ['detect', '--input', file],
      ['autoseq', '--catalog', catalog, '--input', file],
      ['sequence', '--config', join(root, 'examples/orchestration.yaml'), '--input', file],
      ['predict', '--input', file],
    ]) {
      err = '';
      expect(await main(argv), argv[0]).toBe(0);
      expect(err, argv[0]).toMatch(/2 bad (input )?line\(s\) skipped of \d+/);
      err = '';
      expect(await main([...argv, '--strict']), argv[0]).toBe(1);
      expect(err, argv[0]).toMatch(/2 bad input line\(s\) skipped of \d+ \(--strict: exit 1\)/);
    }
    // A clean file passes --strict.
    expect(await main(['detect', '--input', EVENTS, '--strict'])).toBe(0);
  });
});

describe('readEvents: unknown fields and scope aliases', () => {
  const event = (over: Record<string, unknown>) =>
    JSON.stringify({
      type: 'tool_call',
      event_id: `e${Math.random()}`,
      ts: 1,
      session_id: 's',
      task_id: 't',
      step: 0,
      tool: 'a',
      ...over,
    });

  async function read(lines: string[]) {
    const dir = mkdtempSync(join(tmpdir(), 'paver-jsonl-'));
    const file = join(dir, 'e.jsonl');
    writeFileSync(file, lines.join('\n') + '\n');
    const stats: ReadStats = { lines: 0, bad: 0 };
    const warnings: string[] = [];
    const events = [];
    for await (const e of readEvents(file, stats, (s) => warnings.push(s))) events.push(e);
    return { events, stats, warnings };
  }

  it('a line whose type or fields are Object.prototype members is a bad line or an unknown field, not a crash', async () => {
    // Before: a type `constructor` read a function as the type's known fields, and the whole run threw.
    const r = await read([
      JSON.stringify({ type: 'constructor', event_id: 'x' }),
      JSON.stringify({ type: 'toString', event_id: 'y' }),
      event({}).replace('{', '{"__proto__":1,"zzz":2,'),
    ]);
    expect(r.events).toHaveLength(1);
    expect(r.stats.bad).toBe(2);
    // Before: `__proto__` set the tally's prototype and was never reported.
    expect(r.warnings.join('\n')).toMatch(/unknown fields ignored: .*'__proto__' on 1 line/);
  });

  it('reads agent/tenant as agent_id/tenant_id, noting it once per alias', async () => {
    const r = await read([
      event({ agent: 'billing', tenant: 'acme' }),
      event({ agent: 'support', tenant: 'acme' }),
      event({ agent_id: 'x' }),
    ]);
    expect(r.events.map((e) => [e.tenant_id, e.agent_id])).toEqual([
      ['acme', 'billing'],
      ['acme', 'support'],
      ['default', 'x'],
    ]);
    expect(r.warnings.filter((w) => w.includes("'agent' read as 'agent_id'"))).toHaveLength(1);
    expect(r.warnings.filter((w) => w.includes("'tenant' read as 'tenant_id'"))).toHaveLength(1);
    expect(r.stats.unknown).toEqual({});
  });

  it('leaves an agent/tenant that is not an id as an unknown field: the defaults apply, nothing is rejected', async () => {
    const r = await read([
      event({ agent: { name: 'tool-calling', model: 'gpt-4o' }, tenant: 'x'.repeat(300) }),
      event({ agent: 7 }),
      event({ agent: 'billing' }),
    ]);
    expect(r.stats.bad).toBe(0);
    expect(r.events.map((e) => [e.tenant_id, e.agent_id])).toEqual([
      ['default', 'default'],
      ['default', 'default'],
      ['default', 'billing'],
    ]);
    expect(r.stats.unknown).toEqual({ agent: 2, tenant: 1 });
    expect(r.warnings.filter((w) => w.includes("'agent' is not an id"))).toHaveLength(1);
  });

  it('reads a null agent/tenant as not given: the defaults apply, nothing is rejected', async () => {
    const r = await read([event({ agent: null, tenant: null }), event({ agent: null })]);
    expect(r.stats.bad).toBe(0);
    expect(r.events.map((e) => [e.tenant_id, e.agent_id])).toEqual([
      ['default', 'default'],
      ['default', 'default'],
    ]);
    expect(r.stats.unknown).toEqual({});
  });

  it('counts unknown fields per name and reports each name once, never a value', async () => {
    const r = await read([
      event({ colour: 'SECRET-1', agent_id: 'a', agent: 'b' }),
      event({ colour: 'SECRET-2' }),
      event({ size: 3 }),
    ]);
    expect(r.events).toHaveLength(3);
    // agent next to agent_id is not an alias: agent_id wins and agent is reported.
    expect(r.events[0]!.agent_id).toBe('a');
    expect(r.stats.unknown).toEqual({ colour: 2, agent: 1, size: 1 });
    const report = r.warnings.filter((w) => w.includes('unknown fields'));
    expect(report).toHaveLength(1);
    expect(report[0]).toContain("'colour' on 2 line(s)");
    expect(r.warnings.join('\n')).not.toContain('SECRET');
  });
});

describe('inputs read whole have a size limit (a huge file or an endless stdin must not exhaust the memory)', () => {
  const dir = () => mkdtempSync(join(tmpdir(), 'paver-cli-limit-'));
  // Bytes, as a real stdin gives them.
  const withStdinBytes = (text: string) =>
    vi
      .spyOn(process, 'stdin', 'get')
      .mockReturnValue(Readable.from([Buffer.from(text)]) as typeof process.stdin);
  // An OTLP/JSON export with no span: valid, so a command that reads it whole exits 0.
  const emptyExport = (padTo: number) => {
    const doc = JSON.stringify({ resourceSpans: [] });
    return doc + ' '.repeat(Math.max(0, padTo - doc.length));
  };

  it('paver otel refuses an export over --max-input-bytes, file or stdin, naming the limit and the flag: exit 2', async () => {
    const file = join(dir(), 'export.json');
    writeFileSync(file, emptyExport(4096));
    expect(await main(['otel', '--input', file, '--max-input-bytes', '4096'])).toBe(0);
    err = '';
    // Before, the flag did not exist and a file was read whole, however large.
    expect(await main(['otel', '--input', file, '--max-input-bytes', '4095'])).toBe(2);
    expect(err).toContain(`${file} is larger than 4095 bytes, the limit (raise it with --max-input-bytes)`);
    expect(out).toBe('');

    err = '';
    withStdinBytes(emptyExport(5000));
    expect(await main(['otel', '--input', '-', '--max-input-bytes', '4096'])).toBe(2);
    expect(err).toContain('stdin is larger than 4096 bytes, the limit (raise it with --max-input-bytes)');
  });

  it('paver otel stops reading an endless input at the limit (/dev/zero)', async () => {
    // Before: readFile('/dev/zero') never ends, and the process runs out of memory.
    expect(await main(['otel', '--input', '/dev/zero', '--max-input-bytes', String(1024 * 1024)])).toBe(2);
    expect(err).toContain(`/dev/zero is larger than ${1024 * 1024} bytes`);
  });

  it('paver otel refuses a --max-input-bytes that is not a usable limit (exit 2, the usage error)', async () => {
    for (const bad of ['0', '-1', 'lots', String(600 * 1024 * 1024)]) {
      err = '';
      expect(await main(['otel', '--input', '-', '--max-input-bytes', bad]), bad).toBe(2);
      expect(err, bad).toContain('--max-input-bytes');
    }
  });

  it('paver predict and savings refuse tuning flags out of range (exit 2, naming the ranges)', async () => {
    const input = join(root, 'examples/autoseq-events.jsonl');
    for (const [flag, bad] of [
      ['--family-trials', '-1'],
      ['--family-trials', '1.5'],
      ['--window', '1'],
    ] as const) {
      err = '';
      expect(await main(['savings', '--input', input, `${flag}=${bad}`]), flag + bad).toBe(2);
      expect(err, flag + bad).toContain(`${flag} must be an integer ≥`);
    }
  });

  it('paver predict and savings accept exactly what the service accepts for the same setting (AUTOSEQ_LEARN_*)', async () => {
    const { autoseqEnvSchema } = await import('../../services/autoseq/src/config.js');
    const input = join(root, 'examples/autoseq-events.jsonl');
    const serviceTakes = (env: string, v: string) =>
      autoseqEnvSchema.safeParse({ KAFKA_BROKERS: 'k:9092', REDIS_URL: 'redis://r:6379', [env]: v }).success;
    const flags = [
      ['max-k', 'AUTOSEQ_LEARN_MAX_K', 1, 8],
      ['min-trials', 'AUTOSEQ_LEARN_MIN_TRIALS', 1, 100_000],
      ['min-precision', 'AUTOSEQ_LEARN_MIN_PRECISION', 0, 1],
      ['target-precision', 'AUTOSEQ_LEARN_TARGET_PRECISION', 0, 1],
      ['window', 'AUTOSEQ_LEARN_WINDOW', 2, 1_000_000],
      ['family-trials', 'AUTOSEQ_LEARN_FAMILY_TRIALS', 0, 100_000],
      ['max-slots', 'AUTOSEQ_LEARN_MAX_SLOTS', 10, 1_000_000],
      ['max-contexts', 'AUTOSEQ_LEARN_MAX_CONTEXTS', 10, 1_000_000],
      ['task-history', 'AUTOSEQ_LEARN_TASK_HISTORY', 1, 1000],
    ] as const;
    for (const [flag, env, min, max] of flags) {
      // Before: '' read as 0 (--target-precision '' meant 0 and was taken), 2.5 trials and a window of 10^12
      // were taken, and a refusal listed every flag's range without saying which flag was wrong.
      for (const v of [
        String(min - 1),
        String(min),
        String(min + 0.5),
        String(max),
        String(max + 1),
        '',
        'x',
      ]) {
        err = '';
        const code = await main(['predict', '--input', input, `--${flag}=${v}`]);
        expect(code, `--${flag}=${v}`).toBe(serviceTakes(env, v) && v !== '' ? 0 : 2);
        if (code === 2)
          expect(err, `--${flag}=${v}`).toMatch(new RegExp(`^paver predict: --${flag} must be .*, got '`));
      }
    }
  });

  it('a configuration read from stdin or a file is refused over PAVER_MAX_CONFIG_BYTES, naming it: exit 2 like other unreadable configurations', async () => {
    const flows = readFileSync(join(root, 'examples/flows.yaml'), 'utf8');
    const padded = `${flows}\n# ${'x'.repeat(4096)}\n`;
    const select = (flowsArg: string) =>
      main(['select', '--flows', flowsArg, '--query', 'refund my order 42']);
    vi.stubEnv('PAVER_MAX_CONFIG_BYTES', '4096');
    try {
      withStdinBytes(padded);
      // Before, stdin was read whole, however large: the command answered (exit 0).
      expect(await select('-')).toBe(2);
      expect(err).toContain(
        'stdin is larger than 4096 bytes, the limit (raise it with PAVER_MAX_CONFIG_BYTES)',
      );
      expect(out).toBe('');

      err = '';
      const file = join(dir(), 'flows.yaml');
      writeFileSync(file, padded);
      expect(await select(file)).toBe(2);
      expect(err).toContain(`${file} is larger than 4096 bytes`);

      vi.stubEnv('PAVER_MAX_CONFIG_BYTES', String(Buffer.byteLength(padded)));
      withStdinBytes(padded);
      expect(await select('-')).toBe(0);

      err = '';
      vi.stubEnv('PAVER_MAX_CONFIG_BYTES', 'big');
      withStdinBytes(flows);
      expect(await select('-')).toBe(2);
      expect(err).toContain('PAVER_MAX_CONFIG_BYTES: expected an integer');
    } finally {
      vi.unstubAllEnvs();
    }
  });
});

describe('paver otel --tenant', () => {
  it('refuses a tenant that is not an id, and an empty attribute name (exit 2, nothing out)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-tenant-'));
    const input = join(dir, 'export.json');
    writeFileSync(input, JSON.stringify({ resourceSpans: [] }));
    for (const [flag, v] of [
      // Before: exit 0, and every event carried tenant_id '' that each consumer refused as a bad line.
      ['--tenant', ''],
      ['--tenant', 'a\u0007b'],
      ['--tenant-attribute', ''],
    ] as const) {
      err = '';
      expect(await main(['otel', '--input', input, flag, v]), `${flag} ${JSON.stringify(v)}`).toBe(2);
      expect(err, flag).toMatch(new RegExp(`^paver otel: ${flag} must be `));
    }
    expect(out).toBe('');
    expect(await main(['otel', '--input', input, '--tenant', 'acme'])).toBe(0);
  });
});

describe('paver otel and the ingest service refuse the same requests', () => {
  const base = { KAFKA_BROKERS: 'k:9092', REDIS_URL: 'redis://r:6379' };
  const request = (n: number) => ({
    resourceSpans: [
      {
        scopeSpans: [
          {
            spans: Array.from({ length: n }, (_, i) => ({
              traceId: '0'.repeat(31) + '1',
              spanId: (i + 1).toString(16).padStart(16, '0'),
              name: 'http',
              startTimeUnixNano: '1700000000000000000',
            })),
          },
        ],
      },
    ],
  });
  const serviceTakes = (n: number, env: Record<string, string> = {}) =>
    decodeOtlp(
      Buffer.from(JSON.stringify(request(n))),
      'otlp_json',
      decodeLimitsFromEnv(ingestEnvSchema.parse({ ...base, ...env })),
    ).ok;

  it('by default, and with the same bound given to both', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-otel-spans-'));
    const input = (n: number) => {
      const file = join(dir, `request-${n}.json`);
      writeFileSync(file, JSON.stringify(request(n)));
      return file;
    };
    const commandTakes = async (n: number, flags: string[] = []) => {
      err = '';
      const code = await main(['otel', '--input', input(n), '--strict', ...flags]);
      expect(code, `${n} spans ${flags.join(' ')}`).not.toBe(2);
      return code === 0;
    };
    // Before: the command took up to 1,000,000 spans a request, the service (INGEST_MAX_SPANS_PER_MESSAGE) 10,000.
    for (const n of [10_000, 10_001]) expect(await commandTakes(n), `${n} spans`).toBe(serviceTakes(n));
    expect(serviceTakes(10_001)).toBe(false);
    expect(err).toContain('10001 spans in one request > 10000');
    for (const [n, bound] of [
      [10_001, 10_001],
      [11, 10],
      [10, 10],
    ] as const)
      expect(
        await commandTakes(n, ['--max-spans-per-message', String(bound)]),
        `${n} spans, bound ${bound}`,
      ).toBe(serviceTakes(n, { INGEST_MAX_SPANS_PER_MESSAGE: String(bound) }));
  });
});

describe('paver otel --output', () => {
  const attr = (key: string, stringValue: string) => ({ key, value: { stringValue } });
  // One agent span and its one tool span: two events out.
  const EXPORT = JSON.stringify({
    resourceSpans: [
      {
        scopeSpans: [
          {
            spans: [
              {
                traceId: '0af7651916cd43dd8448eb211c80319c',
                spanId: 'b7ad6b7169203331',
                name: 'invoke_agent A',
                startTimeUnixNano: '1000000000',
                endTimeUnixNano: '4000000000',
                attributes: [attr('gen_ai.operation.name', 'invoke_agent')],
              },
              {
                traceId: '0af7651916cd43dd8448eb211c80319c',
                spanId: '00f067aa0ba902b7',
                parentSpanId: 'b7ad6b7169203331',
                name: 'execute_tool lookup',
                startTimeUnixNano: '2000000000',
                endTimeUnixNano: '3000000000',
                attributes: [
                  attr('gen_ai.operation.name', 'execute_tool'),
                  attr('gen_ai.tool.name', 'lookup'),
                ],
              },
            ],
          },
        ],
      },
    ],
  });
  const setUp = () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-out-'));
    const input = join(dir, 'export.json');
    writeFileSync(input, EXPORT);
    return { dir, input };
  };

  it('a path that cannot be written is one line naming it and why, exit 2 as an unreadable input, before any read', async () => {
    const { dir, input } = setUp();
    writeFileSync(join(dir, 'plain'), 'x');
    const locked = join(dir, 'locked');
    mkdirSync(locked, { mode: 0o500 });
    const cases: [string, RegExp][] = [
      [join(dir, 'missing', 'out.jsonl'), /ENOENT: no such directory .*missing$/],
      [dir, /EISDIR: it is a directory$/],
      [join(dir, 'plain', 'out.jsonl'), /ENOTDIR: a part of the path is not a directory$/],
    ];
    // Root writes where the mode bits say no one may: the case holds for every other user.
    if (process.getuid?.() !== 0) cases.push([join(locked, 'out.jsonl'), /EACCES: permission denied$/]);
    for (const [output, why] of cases) {
      err = '';
      // Before: exit 1, as a failed run; a file that cannot be read exits 2.
      expect(await main(['otel', '--input', input, '--output', output]), output).toBe(2);
      expect(err, output).toMatch(new RegExp(`^paver otel: cannot write ${output}: `));
      expect(err.trim(), output).toMatch(why);
      expect(err.trim().split('\n'), output).toHaveLength(1);
      // Said before the export was read: an unreadable input too gets the output's line, not a read error.
      err = '';
      expect(await main(['otel', '--input', join(dir, 'none.json'), '--output', output]), output).toBe(2);
      expect(err, output).toMatch(/^paver otel: cannot write /);
    }
    expect(out).toBe('');
    expect(readdirSync(dir).sort()).toEqual(['export.json', 'locked', 'plain']);
  });

  it('writes the whole output, or leaves the path as it was: never a partial file', async () => {
    const { dir, input } = setUp();
    const file = join(dir, 'out.jsonl');
    writeFileSync(file, 'earlier output\n', { mode: 0o600 });
    const listeners = () => ['SIGINT', 'SIGTERM', 'exit'].map((e) => process.listenerCount(e));
    const before = listeners();
    // An input that cannot be read: the earlier file stays whole. Before, it was emptied (opened first).
    expect(await main(['otel', '--input', join(dir, 'none.json'), '--output', file])).toBe(2);
    expect(readFileSync(file, 'utf8')).toBe('earlier output\n');
    // A write that fails (a full disk): exit 2 and one line naming the path and the reason.
    err = '';
    expect(await main(['otel', '--input', input, '--output', '/dev/full'])).toBe(2);
    expect(err.trim()).toBe('paver otel: cannot write /dev/full: ENOSPC: no space left on device');
    // Done: the events, the file's permissions kept, nothing left beside it.
    expect(await main(['otel', '--input', input, '--output', file])).toBe(0);
    const events = readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { type: string }).type);
    expect(events).toEqual(['tool_call', 'task_completed']);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(readdirSync(dir).sort()).toEqual(['export.json', 'out.jsonl']);
    // A device is written in place.
    expect(await main(['otel', '--input', input, '--output', '/dev/null'])).toBe(0);
    expect(out).toBe('');
    // The temporary file's signal and exit listeners go with it, whichever way each run ended.
    expect(listeners()).toEqual(before);
  });

  // bin/paver.js's launch, from the sources (bin/paver.js runs the build, which a unit test does not make).
  const RUN =
    "const { main } = await import('./cli/paver.ts'); process.exitCode = await main(process.argv.slice(1));";

  it.each(['SIGINT', 'SIGTERM'] as const)(
    'a run stopped by %s leaves nothing beside the path, and the file there as it was',
    async (signal) => {
      const { dir } = setUp();
      const file = join(dir, 'out.jsonl');
      writeFileSync(file, 'earlier output\n');
      const child = spawn(
        process.execPath,
        ['--import', 'tsx', '--input-type=module', '-e', RUN, 'otel', '--input', '-', '--output', file],
        { cwd: root, stdio: ['pipe', 'ignore', 'pipe'] },
      );
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.stdin.on('error', () => undefined);
      try {
        // Half an export on a stdin kept open: the command is mid-run, its temporary file open beside the path.
        child.stdin.write(EXPORT.slice(0, 100));
        await waitFor(
          () => readdirSync(dir).some((n) => n.endsWith('.tmp')),
          'the temporary file beside the output',
          30_000,
        );
        child.kill(signal);
        await waitFor(
          () => child.exitCode !== null || child.signalCode !== null,
          `exit after ${signal}`,
          20_000,
        );
        // Ended by the signal, as an offline command without a handler is (a shell says 130 or 143).
        expect({ code: child.exitCode, signal: child.signalCode }, stderr).toEqual({ code: null, signal });
        // Before, the temporary file stayed beside the output.
        expect(readdirSync(dir).sort()).toEqual(['export.json', 'out.jsonl']);
        expect(readFileSync(file, 'utf8')).toBe('earlier output\n');
      } finally {
        child.kill('SIGKILL');
      }
    },
  );
});

describe('option values that start with a dash', () => {
  it('are values, as commander read them: a negative number gets its range, a query may start with -', async () => {
    for (const argv of [
      ['detect', '--input', EVENTS, '--min-length', '-1'],
      ['flows', 'replay', '--input', EVENTS, '--min-occurrences', '-1'],
      ['otel', '--input', EVENTS, '--max-payload-bytes', '-1'],
    ]) {
      err = '';
      // Before: parseArgs' "argument is ambiguous" and the whole usage, not what the flag accepts.
      expect(await main(argv), argv.join(' ')).toBe(2);
      expect(err, argv.join(' ')).not.toContain('ambiguous');
      expect(err.trim().split('\n'), argv.join(' ')).toHaveLength(1);
      expect(err, argv.join(' ')).toContain(argv.at(-2)!);
    }
    err = '';
    const flows = join(root, 'examples/flows.yaml');
    expect(await main(['select', '--flows', flows, '--query', '-refund my order 42'])).toBe(0);
    expect(err).toBe('');
    expect(JSON.parse(out)).toMatchObject({ path: expect.any(String) });
  });
});

describe('numeric flags take exactly what the service takes for the same setting', () => {
  const base = { KAFKA_BROKERS: 'k:9092', REDIS_URL: 'redis://r:6379' };
  const flows = join(root, 'examples/flows.yaml');
  const catalog = join(root, 'examples/catalog.yaml');
  const autoseqEvents = join(root, 'examples/autoseq-events.jsonl');
  const MAX = Number.MAX_SAFE_INTEGER;
  it.each([
    [['detect', '--input', EVENTS], 'min-length', 'detector', 'DETECTOR_MIN_LENGTH', 1, 100],
    [['detect', '--input', EVENTS], 'max-length', 'detector', 'DETECTOR_MAX_LENGTH', 1, 100],
    [['detect', '--input', EVENTS], 'min-occurrences', 'detector', 'DETECTOR_MIN_OCCURRENCES', 1, 1_000_000],
    [['detect', '--input', EVENTS], 'lookback', 'detector', 'DETECTOR_LOOKBACK', 1, 1_000_000],
    [['detect', '--input', EVENTS], 'max-candidates', 'detector', 'DETECTOR_MAX_CANDIDATES', 1, 1000],
    [['detect', '--input', EVENTS], 'task-idle-ms', 'detector', 'DETECTOR_TASK_IDLE_MS', 1, MAX],
    [['detect', '--input', EVENTS], 'max-task-events', 'detector', 'DETECTOR_MAX_TASK_EVENTS', 1, 100_000],
    [
      ['autoseq', '--catalog', catalog, '--input', autoseqEvents],
      'max-consecutive',
      'autoseq',
      'AUTOSEQ_MAX_CONSECUTIVE',
      1,
      1000,
    ],
    [['select', '--flows', flows, '--query', 'refund my order 42'], 'top-k', 'flows', 'FLOWS_TOP_K', 1, 100],
    [['select', '--flows', flows, '--query', 'refund my order 42'], 'rrf-k', 'flows', 'FLOWS_RRF_K', 1, 1000],
    [
      ['select', '--flows', flows, '--query', 'refund my order 42'],
      'score-floor',
      'flows',
      'FLOWS_SCORE_FLOOR',
      0,
      MAX,
    ],
    [
      ['flows', 'replay', '--input', autoseqEvents],
      'min-occurrences',
      'flows',
      'FLOWS_AUTO_MIN_OCCURRENCES',
      1,
      MAX,
    ],
    [
      ['flows', 'replay', '--input', autoseqEvents],
      'shadow-trials',
      'flows',
      'FLOWS_SHADOW_TRIALS',
      0,
      1_000_000,
    ],
    [
      ['flows', 'replay', '--input', autoseqEvents],
      'shadow-precision',
      'flows',
      'FLOWS_SHADOW_PRECISION',
      0,
      1,
    ],
    [
      ['otel', '--input', EVENTS],
      'max-payload-bytes',
      'ingest',
      'INGEST_MAX_PAYLOAD_BYTES',
      0,
      16 * 1024 * 1024,
    ],
    [
      ['otel', '--input', EVENTS],
      'max-spans-per-message',
      'ingest',
      'INGEST_MAX_SPANS_PER_MESSAGE',
      1,
      1_000_000,
    ],
  ] as const)('%s --%s as %s %s', async (argv, flag, service, env, min, max) => {
    const schema = {
      detector: detectorEnvSchema,
      autoseq: autoseqEnvSchema,
      flows: flowsEnvSchema,
      ingest: ingestEnvSchema,
    }[service];
    const serviceTakes = (v: string) => v.trim() !== '' && schema.safeParse({ ...base, [env]: v }).success;
    const probes = [min - 1, min, min + 0.5, ...(max === MAX ? [] : [max, max + 1])].map(String);
    // Before: '' was 0 where 0 was allowed, 1.5 was floored or kept, ranges had no top, and messages no flag name.
    for (const v of [...probes, '', ' ', 'x']) {
      err = '';
      out = '';
      const code = await main([...argv, `--${flag}=${v}`]);
      expect(code, `--${flag}=${v}`).toBe(serviceTakes(v) ? 0 : 2);
      if (code === 2) {
        expect(err, `--${flag}=${v}`).toMatch(/^paver [a-z ]+: .*must be/);
        expect(err, `--${flag}=${v}`).toContain(`--${flag}`);
        expect(out, `--${flag}=${v}`).toBe('');
      }
    }
  });
});

describe('FLOWS_* settings in the offline commands', () => {
  const flows = join(root, 'examples/flows.yaml');
  const select = ['select', '--flows', flows, '--query', 'refund my order 42'];
  afterEach(() => vi.unstubAllEnvs());

  it('an empty variable is unset, as the service reads it', async () => {
    expect(await main(select)).toBe(0);
    const unset = out;
    out = '';
    // Before: FLOWS_TOP_K= was read as 0 and refused (exit 2), though the service starts with its default.
    vi.stubEnv('FLOWS_TOP_K', '');
    vi.stubEnv('FLOWS_CHAT_URL', '');
    expect(await main(select)).toBe(0);
    expect(out).toBe(unset);
  });

  it('a bad one is one message naming it, exit 2, before any input is read', async () => {
    vi.stubEnv('FLOWS_TOP_K', 'many');
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-env-'));
    const candidates = join(dir, 'candidates.json');
    writeFileSync(candidates, '[]\n');
    for (const argv of [
      select,
      ['flows', 'replay', '--input', EVENTS],
      // Before: the whole history was read, then an uncaught ZodError with a stack trace.
      ['flows', 'from-candidates', '--input', candidates, '--history', EVENTS],
    ]) {
      err = '';
      out = '';
      expect(await main(argv), argv.join(' ')).toBe(2);
      expect(err, argv.join(' ')).toMatch(/^paver [a-z -]+: FLOWS_\* settings: Invalid configuration/);
      expect(err, argv.join(' ')).toContain('FLOWS_TOP_K: ');
      // zod's issue list as JSON, before.
      expect(err, argv.join(' ')).not.toContain('"code"');
      expect(out, argv.join(' ')).toBe('');
    }
  });
});

describe('paver flows from-candidates on a file of another shape', () => {
  it('names the field a candidate lacks, or the shape it expects (it said only "(root): Invalid input")', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-cands-'));
    const lines = join(dir, 'candidates.jsonl');
    writeFileSync(lines, '{"tool_sequence": ["a", "b"]}\n{"tool_sequence": ["b", "c"]}\n');
    err = '';
    out = '';
    expect(await main(['flows', 'from-candidates', '--input', lines])).toBe(2);
    expect(err).toContain('0.occurrence_count: ');
    expect(out).toBe('');
    const text = join(dir, 'candidates.yaml');
    writeFileSync(text, 'just words\n');
    err = '';
    expect(await main(['flows', 'from-candidates', '--input', text])).toBe(2);
    expect(err).toContain('expected a JSON array of candidates');
  });
});

describe('an empty configuration file', () => {
  it('is refused, naming it, by every command that reads one (it was an empty list, or a riddle)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-empty-'));
    const empty = join(dir, 'candidates.json');
    writeFileSync(empty, '\n');
    const autoseqEvents = join(root, 'examples/autoseq-events.jsonl');
    for (const [argv, code] of [
      // Before: exit 0 with "[]" — a failed `paver detect > candidates.json` passed on as "no candidates".
      [['flows', 'from-candidates', '--input', empty], 2],
      // Before: exit 0, nothing chosen.
      [['select', '--flows', empty, '--query', 'refund my order 42'], 2],
      [['flows', 'replay', '--input', autoseqEvents, '--flows', empty], 2],
      // Before: "invalid catalog: (root): expected object, received array".
      [['autoseq', '--catalog', empty, '--input', autoseqEvents], 2],
      [['predict', '--catalog', empty, '--input', autoseqEvents], 2],
      [['sequence', '--config', empty, '--input', EVENTS], 2],
    ] as const) {
      err = '';
      out = '';
      expect(await main([...argv]), argv.join(' ')).toBe(code);
      expect(err, argv.join(' ')).toContain(`${empty} is empty`);
      expect(out, argv.join(' ')).toBe('');
    }
  });
});

describe("two options on '-'", () => {
  it('is a usage error naming both (stdin is read once; the second read nothing)', async () => {
    const text = readFileSync(join(root, 'examples/autoseq-events.jsonl'), 'utf8');
    for (const argv of [
      ['autoseq', '--catalog', '-', '--input', '-'],
      ['sequence', '--config', '-', '--input', '-'],
      ['predict', '--catalog', '-', '--input', '-'],
      ['flows', 'replay', '--flows', '-', '--input', '-'],
      ['flows', 'from-candidates', '--input', '-', '--history', '-'],
    ]) {
      withStdin(text);
      err = '';
      out = '';
      // Before: exit 0 and nothing (or an answer for an empty input) on stdout.
      expect(await main(argv), argv.join(' ')).toBe(2);
      expect(err, argv.join(' ')).toMatch(/--\w+ and --\w+ cannot both read stdin/);
      expect(err.trim().split('\n'), argv.join(' ')).toHaveLength(1);
      expect(out, argv.join(' ')).toBe('');
    }
  });
});

describe('a slow reader of stdout', () => {
  it('holds predict, autoseq and sequence until stdout drains (the output no longer piles up in memory)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-cli-drain-'));
    const input = join(dir, 'events.jsonl');
    const lines: string[] = [];
    for (let t = 0; t < 700; t++) {
      for (let s = 0; s < 5; s++)
        lines.push(
          JSON.stringify({
            type: 'tool_call',
            event_id: `e${t}-${s}`,
            session_id: `s${t}`,
            task_id: `t${t}`,
            step: s,
            ts: 1_760_000_000_000 + t * 10 + s,
            tool: ['http_get', 'parse_json', 'summarize', 'search', 'reflect'][s],
            args: { n: s },
            observation: { ok: true },
          }),
        );
      lines.push(
        JSON.stringify({
          type: 'task_completed',
          event_id: `c${t}`,
          session_id: `s${t}`,
          task_id: `t${t}`,
          ts: 1_760_000_000_000 + t * 10 + 9,
        }),
      );
    }
    writeFileSync(input, lines.join('\n') + '\n');
    for (const argv of [
      ['predict', '--input', input],
      ['autoseq', '--catalog', join(root, 'examples/catalog.yaml'), '--input', input],
      ['sequence', '--config', join(root, 'examples/orchestration.yaml'), '--input', input],
    ]) {
      // A full buffer at every write, drained only when the command is seen waiting for it.
      let sinceDrain = 0;
      let writes = 0;
      vi.spyOn(process.stdout, 'write').mockImplementation(() => {
        sinceDrain++;
        writes++;
        return false;
      });
      const base = process.stdout.listenerCount('drain');
      let code: number | undefined;
      void main(argv).then((c) => (code = c));
      while (code === undefined) {
        await vi.waitFor(
          () => {
            if (code === undefined && process.stdout.listenerCount('drain') === base)
              throw new Error('running');
          },
          { timeout: 20_000, interval: 1 },
        );
        if (code !== undefined) break;
        // Before: nothing ever waited; every block was written at once and kept in memory.
        expect(sinceDrain, argv[0]).toBe(1);
        sinceDrain = 0;
        process.stdout.emit('drain');
      }
      process.stdout.emit('drain');
      expect(code, argv[0]).toBe(0);
      // The last block may follow the one the loop ended on.
      expect(sinceDrain, argv[0]).toBeLessThanOrEqual(2);
      expect(writes, argv[0]).toBeGreaterThan(2);
    }
  });
});

describe('--help gives the defaults the commands use', () => {
  it('paver detect: every tuning flag, from the detector parameters', async () => {
    const { DEFAULT_PARAMS } = await import('../../services/detector/src/core/params.js');
    expect(await main(['detect', '--help'])).toBe(0);
    const help = (out + err).replace(/\s+/g, ' ');
    // Before: --task-idle-ms and --window-ms said nothing of their defaults.
    for (const [flag, value] of [
      ['min-length', DEFAULT_PARAMS.minLength],
      ['max-length', DEFAULT_PARAMS.maxLength],
      ['min-occurrences', DEFAULT_PARAMS.minOccurrences],
      ['lookback', DEFAULT_PARAMS.lookback],
      ['max-candidates', DEFAULT_PARAMS.maxCandidates],
      ['task-idle-ms', DEFAULT_PARAMS.taskIdleMs],
      ['max-task-events', DEFAULT_PARAMS.maxTaskEvents],
    ] as const)
      expect(help).toMatch(new RegExp(`--${flag} <n> [^-]*\\(default ${value}\\b`));
    expect(DEFAULT_PARAMS.windowMs).toBeNull();
    expect(help).toMatch(/--window-ms <n> [^-]*\(default: no time limit\)/);
  });

  it('paver select: the floors name the variables they default to', async () => {
    expect(await main(['select', '--help'])).toBe(0);
    const help = (out + err).replace(/\s+/g, ' ');
    // Before: --score-floor said "default 0" though FLOWS_SCORE_FLOOR sets it.
    expect(help).toContain('(default FLOWS_SCORE_FLOOR, 0)');
    expect(help).toContain('(default FLOWS_OUTCOME_FLOOR, 0)');
  });
});

describe('paver detect --tenant/--agent', () => {
  it('says when the file holds no events of the scope asked for, and refuses an empty one', async () => {
    // Before: `[]` and exit 0 with not a word (a misspelt tenant looked like a scope with no candidates).
    expect(await main(['detect', '--input', EVENTS, '--tenant', 'nobody'])).toBe(0);
    expect(out.trim()).toBe('[]');
    expect(err).toContain('no events of nobody/default in the file');
    err = '';
    out = '';
    expect(await main(['detect', '--input', EVENTS, '--tenant', 'default'])).toBe(0);
    expect(err).toBe('');
    expect(JSON.parse(out)).not.toEqual([]);
    // Before: '' was no filter at all.
    for (const flag of ['--tenant', '--agent']) {
      err = '';
      out = '';
      expect(await main(['detect', '--input', EVENTS, `${flag}=`])).toBe(2);
      expect(err).toContain(`${flag} must be an id`);
      expect(out).toBe('');
    }
  });
});

describe('paver flows registry verbs: --url', () => {
  it("keep the URL's own path (a service behind a gateway) and refuse one that is not a URL", async () => {
    const { createServer } = await import('node:http');
    const seen: string[] = [];
    const server = createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      res.writeHead(200, { 'content-type': 'application/json' }).end('[]');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    try {
      expect(await main(['flows', 'list', '--url', `${url}/paver-flows/`, '--status', 'pending'])).toBe(0);
      expect(
        await main(['flows', 'promote', 'a b', '--url', `${url}/gw/paver-flows`, '--tenant', 't1']),
      ).toBe(0);
      expect(await main(['flows', 'registry', '--url', url])).toBe(0);
      // Before: /flows/candidates?… and /flows/candidates/a%20b/promote?…, the prefix dropped.
      expect(seen).toEqual([
        'GET /paver-flows/flows/candidates?tenant_id=default&agent_id=default&status=pending',
        'POST /gw/paver-flows/flows/candidates/a%20b/promote?tenant_id=t1&agent_id=default',
        'GET /flows?tenant_id=default&agent_id=default',
      ]);
      err = '';
      expect(await main(['flows', 'list', '--url', 'not a url'])).toBe(2);
      expect(err).toBe('paver flows: --url (or FLOWS_URL) is not a URL: not a url\n');
    } finally {
      server.close();
    }
  });
});

describe('paver flows registry verbs on an HTTP error', () => {
  it("say the service's JSON error, or the body on one line cut at 500 characters", async () => {
    const { createServer } = await import('node:http');
    const page = `<html>\n<body>\u001b[31m${'proxy error '.repeat(2000)}</body></html>`;
    const server = createServer((req, res) => {
      if (req.url?.startsWith('/flows/candidates/k1'))
        return void res
          .writeHead(404, { 'content-type': 'application/json' })
          .end(JSON.stringify({ error: 'no candidate k1' }));
      if (req.url?.startsWith('/flows?')) return void res.writeHead(500).end('x'.repeat(1 << 20));
      if (req.url?.includes('/promote')) return void res.writeHead(200).end('<html>\n<p>welcome</p></html>');
      res.writeHead(502, { 'content-type': 'text/html' }).end(page);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    try {
      expect(await main(['flows', 'show', 'k1', '--url', url])).toBe(1);
      expect(err).toBe('paver flows show: HTTP 404: no candidate k1\n');
      err = '';
      // Before: the whole page (24 kB, its newlines and escape sequences) went to stderr.
      expect(await main(['flows', 'list', '--url', url])).toBe(1);
      expect(err.split('\n')).toHaveLength(2);
      expect(err).not.toContain('\u001b');
      expect(err).toMatch(/^paver flows list: HTTP 502: <html> <body> \[31mproxy error proxy error /);
      expect(err).toMatch(/… \(cut; \d+ characters in all\)\n$/);
      expect(err.length).toBeLessThan(600);
      err = '';
      // A megabyte is not read whole to say its first 500 characters.
      expect(await main(['flows', 'registry', '--url', url])).toBe(1);
      expect(err).toBe(
        `paver flows registry: HTTP 500: ${'x'.repeat(500)}… (cut; over 65536 bytes in all)\n`,
      );
      err = '';
      // Another server answering 200 with a page: before, a SyntaxError thrown out of the command.
      expect(await main(['flows', 'promote', 'k2', '--url', url])).toBe(1);
      expect(err).toBe(
        `paver flows promote: the answer from ${url} is not JSON (is it the flows service?): <html> <p>welcome</p></html>\n`,
      );
      expect(out).toBe('');
    } finally {
      server.close();
    }
  });
});
