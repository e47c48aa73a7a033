import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startStack } from '../deploy/local/stack.js';
import { SERVICES, type ServiceName } from './services.js';

/**
 * Paver's main job: the local stack (unless KAFKA_BROKERS / REDIS_URL are set) and every service as a child
 * process, each with its HTTP port, until SIGINT/SIGTERM; then services stop first, the stack last.
 */
const example = (f: string) => fileURLToPath(new URL(`../../examples/${f}`, import.meta.url));
/** The main job runs with the example catalog, orchestration and flows unless the environment names others. */
const EXAMPLES = {
  AUTOSEQ_CATALOG_FILE: example('catalog.yaml'),
  SEQUENCER_CONFIG_FILE: example('orchestration.yaml'),
  FLOWS_FILE: example('flows.yaml'),
};

export async function dev(argv: { services?: string[] }): Promise<number> {
  const say = (s: string) => process.stderr.write(`paver dev: ${s}\n`);
  const t0 = Date.now();
  const stack = await startStack({ log: say });
  say(
    `stack ready in ${Date.now() - t0} ms: KAFKA_BROKERS=${stack.brokers} REDIS_URL=${stack.redisUrl}${stack.started.length ? ` (started: ${stack.started.join(', ')})` : ' (external)'}`,
  );

  const names = (argv.services?.length ? argv.services : Object.keys(SERVICES)) as ServiceName[];
  const bin = fileURLToPath(new URL('../../bin/paver.js', import.meta.url));
  const children = new Map<ServiceName, ChildProcess>();
  let stopping = false;
  let failed = false;
  let resolveDone!: () => void;
  const done = new Promise<void>((r) => (resolveDone = r));

  for (const name of names) {
    const port = process.env[`PAVER_${name.toUpperCase()}_HTTP_PORT`] ?? String(SERVICES[name].port);
    const child = spawn(process.execPath, [bin, 'run', name], {
      env: {
        ...EXAMPLES,
        ...process.env,
        KAFKA_BROKERS: stack.brokers,
        REDIS_URL: stack.redisUrl,
        HTTP_PORT: port,
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    children.set(name, child);
    say(`${name} starting: http://127.0.0.1:${port}/readyz  /metrics`);
    child.once('exit', (code, signal) => {
      children.delete(name);
      if (!stopping) {
        failed = true;
        say(`${name} exited (${signal ?? code}); stopping everything`);
        void stop();
      }
      if (children.size === 0) resolveDone();
    });
  }

  async function stop() {
    if (stopping) return;
    stopping = true;
    for (const c of children.values()) c.kill('SIGTERM');
    if (children.size > 0) await done;
    await stack.stop();
    say('stopped');
  }
  await new Promise<void>((resolve) => {
    const onSig = () => void stop().then(resolve);
    process.once('SIGINT', onSig);
    process.once('SIGTERM', onSig);
    void done.then(() => stop().then(resolve));
  });
  return failed ? 1 : 0;
}
