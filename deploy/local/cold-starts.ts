/**
 * Measures cold starts of the main job: N times in a row, `paver dev` on a fresh Kafka and Redis, every
 * service on its own free port. A start counts as good when every /readyz answers 200 with no service having
 * exited on the way. Prints one line per start and the tally; exit 0 only when all N were good.
 *
 *   node dist/deploy/local/cold-starts.js [N=10] [timeoutSeconds=300]
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { SERVICES } from '../../cli/services.js';
import { freePort, packageRoot } from './stack.js';

const n = Number(process.argv[2] ?? 10);
const timeoutMs = Number(process.argv[3] ?? 300) * 1000;
const bin = fileURLToPath(new URL('bin/paver.js', `file://${packageRoot()}/`));

async function ready(port: number): Promise<boolean> {
  try {
    return (await fetch(`http://127.0.0.1:${port}/readyz`)).status === 200;
  } catch {
    return false;
  }
}

async function once(i: number): Promise<{ ok: boolean; ms: number; why: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.KAFKA_BROKERS;
  delete env.REDIS_URL;
  const ports: Record<string, number> = {};
  for (const name of Object.keys(SERVICES)) {
    ports[name] = await freePort();
    env[`PAVER_${name.toUpperCase()}_HTTP_PORT`] = String(ports[name]);
  }
  const t0 = Date.now();
  let out = '';
  const child = spawn(process.execPath, [bin, 'dev'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  let result: { ok: boolean; ms: number; why: string } | null = null;
  while (!result) {
    const died = /paver dev: (\w+) exited \(([^)]*)\)/.exec(out);
    if (died) result = { ok: false, ms: Date.now() - t0, why: `${died[1]} exited (${died[2]})` };
    else if (child.exitCode !== null)
      result = { ok: false, ms: Date.now() - t0, why: `dev exited ${child.exitCode}` };
    else if ((await Promise.all(Object.values(ports).map(ready))).every(Boolean))
      result = { ok: true, ms: Date.now() - t0, why: 'all ready' };
    else if (Date.now() - t0 > timeoutMs) result = { ok: false, ms: Date.now() - t0, why: 'timed out' };
    else await sleep(250);
  }
  child.kill('SIGTERM');
  const code = await exited;
  if (!result.ok || code !== 0) {
    const lines = out
      .split('\n')
      .filter((l) => /error|fatal|exited|does not host/i.test(l))
      .slice(-8);
    process.stderr.write(`--- start ${i} (dev exit ${code}):\n${lines.join('\n')}\n`);
  }
  return code === 0 ? result : { ...result, ok: false, why: `${result.why}; dev exit ${code}` };
}

let good = 0;
for (let i = 1; i <= n; i++) {
  const r = await once(i);
  if (r.ok) good++;
  process.stdout.write(`cold start ${i}/${n}: ${r.ok ? 'ok' : 'FAILED'} in ${r.ms} ms (${r.why})\n`);
}
process.stdout.write(`${good}/${n} cold starts succeeded\n`);
process.exitCode = good === n ? 0 : 1;
