import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/kafka.js';
import { getJson, isReady, ROOT, serviceEnv, startProcess, type Proc } from '../helpers/process.js';

// The package as a user gets it: `npm pack` → install the tarball into a fresh TypeScript project → a file
// that imports 'paver' type-checks, runs and publishes to the real test broker → the detector (started from
// the installed package's own `paver` bin) sees the events.
const dir = mkdtempSync(join(tmpdir(), 'paver-pkg-'));
const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

const TOOLS = ['lookup_record', 'check_policy', 'apply_change'];
const AGENT_TS = `
import { createPublisher, detect, type ToolCallInput, type ToolCallsEvent } from 'paver';

const pub = createPublisher({
  brokers: process.env.KAFKA_BROKERS!.split(','),
  topic: process.env.PAVER_TOPIC_TOOL_CALLS!,
  agentId: 'pkg-agent',
});
const tools = ${JSON.stringify(TOOLS)};
const sent: ToolCallsEvent[] = [];
const pending: Promise<void>[] = [];
for (let t = 0; t < 4; t++) {
  const session_id = 'session-' + t;
  const task_id = 'task-' + t;
  pending.push(pub.userMessage({ session_id, task_id, text: 'please handle case ' + t }));
  for (const [step, tool] of tools.entries()) {
    const call: ToolCallInput = { session_id, task_id, tool, args: { case: t }, status: 'ok' };
    pending.push(pub.toolCall(call));
    sent.push({ ...call, type: 'tool_call', event_id: 'e', ts: 0, tenant_id: 'default', agent_id: 'pkg-agent', step });
  }
  pending.push(pub.taskCompleted({ session_id, task_id, status: 'ok' }));
}
await pub.flush();
await Promise.all(pending);
await pub.close();
// The offline core, in-process, on the same tool calls (no task completes here, so no candidate yet).
const offline = detect(sent);
process.stdout.write(JSON.stringify({ published: pending.length, scopes: offline.scopes.length }) + '\\n');
`;
// Must not type-check: a tool call without its tool, and an unknown event field.
const BAD_TS = `
import { createPublisher } from 'paver';
const pub = createPublisher({ brokers: ['localhost:9092'] });
await pub.toolCall({ session_id: 's', task_id: 't' });
await pub.userMessage({ session_id: 's', text: 'x', agent: 'a' });
`;

const sh = (cmd: string, args: string[], cwd = dir) =>
  execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 600_000 });

let tarball = '';
beforeAll(async () => {
  if (!existsSync(join(ROOT, 'dist/client/index.js')))
    throw new Error('dist/ is missing: run `npm run build`');
  // --ignore-scripts: the suite runs on a fresh build (`npm test` builds first); pack must not rebuild under
  // other test files' feet.
  const packed = JSON.parse(
    sh('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', dir], ROOT),
  ) as {
    filename: string;
  }[];
  tarball = join(dir, packed[0]!.filename);
  const dev = (
    JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
      devDependencies: Record<string, string>;
    }
  ).devDependencies;
  writeFileSync(
    join(dir, 'package.json'),
    JSON.stringify({
      name: 'paver-consumer',
      private: true,
      type: 'module',
      dependencies: {
        paver: `file:${tarball}`,
        typescript: dev.typescript,
        '@types/node': dev['@types/node'],
      },
    }),
  );
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'ES2022',
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        strict: true,
        types: ['node'],
        outDir: 'out',
        skipLibCheck: false,
      },
      files: ['agent.ts'],
    }),
  );
  writeFileSync(join(dir, 'agent.ts'), AGENT_TS);
  writeFileSync(join(dir, 'bad.ts'), BAD_TS);
  // Dependencies come from the npm cache the repo's own install filled.
  sh('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error']);
}, 900_000);

describe('the packed `paver` package', () => {
  it('ships dist/, types and the bin, without tests or sources maps', () => {
    const files = sh('tar', ['-tzf', tarball]).split('\n');
    expect(files).toContain('package/dist/client/index.js');
    expect(files).toContain('package/dist/client/index.d.ts');
    expect(files).toContain('package/dist/cli/paver.js');
    expect(files).toContain('package/bin/paver.js');
    expect(files.filter((f) => /\.test\.|\/test\/|\.map$|\.ts$/.test(f) && !f.endsWith('.d.ts'))).toEqual([]);
  });

  it('`npx paver` works from the install (dist/ is there)', () => {
    expect(sh('npx', ['--no-install', 'paver', '--help'])).toMatch(/Usage: paver/);
  });

  it('type-checks a consumer that imports it, and rejects a malformed event at compile time', () => {
    sh('npx', ['--no-install', 'tsc', '-p', '.']);
    let out = '';
    try {
      sh('npx', [
        '--no-install',
        'tsc',
        '--noEmit',
        '--strict',
        '--module',
        'NodeNext',
        '--moduleResolution',
        'NodeNext',
        '--target',
        'ES2022',
        '--types',
        'node',
        'bad.ts',
      ]);
    } catch (err) {
      out = String((err as { stdout?: string }).stdout);
    }
    expect(out).toMatch(/bad\.ts\(4,[^\n]*\n\s*Property 'tool' is missing/);
    expect(out).toMatch(/bad\.ts\(5,[^\n]*'agent' does not exist/);
  }, 600_000);

  it('publishes to the real broker and the detector from the same install sees the events', async () => {
    const env = serviceEnv();
    const detector = await startProcess(
      [join(dir, 'node_modules/paver/bin/paver.js'), 'run', 'detector'],
      env,
    );
    procs.push(detector);
    await waitFor(() => isReady(detector), 'detector /readyz', 120_000).catch((err: Error) => {
      throw new Error(`${err.message}\n${detector.output()}`);
    });

    const out = execFileSync(process.execPath, ['out/agent.js'], {
      cwd: dir,
      env: { ...env, PATH: process.env.PATH ?? '' },
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(JSON.parse(out)).toEqual({ published: 4 * (TOOLS.length + 2), scopes: 1 });

    const seen = await waitFor(
      async () => {
        const body = (await getJson(detector.url('/candidates?tenant_id=default&agent_id=pkg-agent')))
          .body as {
          tool_sequence: string[];
          occurrence_count: number;
        }[];
        return body.find((c) => c.tool_sequence.join() === TOOLS.join()) ?? null;
      },
      'the detector to report the published sequence as a candidate',
      90_000,
    );
    expect(seen.occurrence_count).toBe(4);
  });
});
