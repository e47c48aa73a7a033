import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startStack, type Stack } from '../deploy/local/stack.js';
import { commonEnvShape, EXIT_CONFIG } from '../shared/config.js';
import { errorMessage } from '../shared/errors.js';
import { SERVICES, type ServiceName } from './services.js';

/**
 * Paver's main job: the local stack (unless KAFKA_BROKERS / REDIS_URL are set) and every service as a child
 * process, each with its HTTP port, until SIGINT/SIGTERM; then services stop first, the stack last.
 *
 * A supervisor, not a launcher: a service that dies is restarted with exponential backoff while the others
 * keep running, and the stack (with Kafka's data) stays up. Only a signal stops everything. A service that
 * exits with the configuration-error code (78) is not restarted: no retry fixes a bad setting.
 */
const example = (f: string) => fileURLToPath(new URL(`../../examples/${f}`, import.meta.url));
/** The main job runs with the example catalog, orchestration and flows unless the environment names others. */
const EXAMPLES = {
  AUTOSEQ_CATALOG_FILE: example('catalog.yaml'),
  SEQUENCER_CONFIG_FILE: example('orchestration.yaml'),
  FLOWS_FILE: example('flows.yaml'),
};

/**
 * How long after its SIGTERM a service may still run before it is SIGKILLed: its own stop gives up at
 * PAVER_SHUTDOWN_TIMEOUT_MS (exit 1), so one still running past that and this margin is hung (a main thread
 * blocked in a synchronous call, a stop that never settles), and dev waited for it for ever, its stack with it.
 */
export const KILL_MARGIN_MS = 5_000;
export function killAfterMs(env: NodeJS.ProcessEnv): number {
  // The services read the same variable from the environment dev passes on; one they refuse (exit 78) stops
  // on its own, and the default stands in for it here.
  const timeout = commonEnvShape.PAVER_SHUTDOWN_TIMEOUT_MS.safeParse(env.PAVER_SHUTDOWN_TIMEOUT_MS);
  return (
    (timeout.success ? timeout.data : commonEnvShape.PAVER_SHUTDOWN_TIMEOUT_MS.parse(undefined)) +
    KILL_MARGIN_MS
  );
}

/** Restart delays: 1 s, 2 s, 4 s … capped at 30 s; a service that ran for a minute starts again from 1 s. */
export const RESTART = { initialMs: 1_000, maxMs: 30_000, healthyAfterMs: 60_000 } as const;
export function restartDelay(failuresInARow: number): number {
  return Math.min(RESTART.maxMs, RESTART.initialMs * 2 ** Math.max(0, failuresInARow - 1));
}

/** A URL as it may be shown: an external REDIS_URL can carry a password, which no log line must. */
export function withoutPassword(url: string): string {
  try {
    const u = new URL(url);
    // ioredis also takes its options from the query (redis://host:6379?password=…), which was shown as given.
    const inQuery = [...u.searchParams.keys()].filter((k) => /pass/i.test(k));
    if (!u.password && inQuery.length === 0) return url;
    if (u.password) u.password = '***';
    for (const k of inQuery) u.searchParams.set(k, '***');
    return u.toString();
  } catch {
    return '(not shown)';
  }
}

export async function dev(argv: { services?: string[] }): Promise<number> {
  const say = (s: string) => process.stderr.write(`paver dev: ${s}\n`);
  const t0 = Date.now();
  let stack: Stack;
  try {
    stack = await startStack({ log: say });
  } catch (err) {
    // What to fix (java or mvn missing, a broker that did not start, with its log) is the message: thrown, it
    // reached the user as a stack trace. startStack has stopped whatever it had started.
    say(`the local stack did not start: ${errorMessage(err)}`);
    return 1;
  }
  say(
    `stack ready in ${Date.now() - t0} ms: KAFKA_BROKERS=${stack.brokers} REDIS_URL=${withoutPassword(stack.redisUrl)}${stack.started.length ? ` (started: ${stack.started.join(', ')})` : ' (external)'}`,
  );

  const names = (argv.services?.length ? argv.services : Object.keys(SERVICES)) as ServiceName[];
  const bin = fileURLToPath(new URL('../../bin/paver.js', import.meta.url));
  const children = new Map<ServiceName, ChildProcess>();
  const timers = new Set<NodeJS.Timeout>();
  let stopping = false;
  // Settled by a signal (0), or by the last service refusing its configuration (78).
  let finish: (code: number) => void = () => undefined;
  const finished = new Promise<number>((resolve) => (finish = resolve));

  function launch(name: ServiceName, failuresInARow: number) {
    if (stopping) return;
    const port = process.env[`PAVER_${name.toUpperCase()}_HTTP_PORT`] ?? String(SERVICES[name].port);
    const startedAt = Date.now();
    const child = spawn(process.execPath, [bin, 'run', name], {
      env: {
        ...EXAMPLES,
        ...process.env,
        KAFKA_BROKERS: stack.brokers,
        REDIS_URL: stack.redisUrl,
        HTTP_PORT: port,
        // Killed outright, this process cannot stop its services: they stop themselves once it is gone.
        PAVER_PARENT_PID: String(process.pid),
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    children.set(name, child);
    say(`${name} starting (pid ${child.pid}): http://127.0.0.1:${port}/readyz  /metrics`);
    child.once('exit', (code, signal) => {
      if (children.get(name) === child) children.delete(name);
      if (stopping) return;
      if (code === EXIT_CONFIG) {
        say(`${name} refused its configuration (exit ${code}); not restarting it (the others keep running)`);
        // With none running nor waiting to restart there is nothing left to supervise: dev idled on the stack
        // until a Ctrl-C, which exited 0, and a script or CI job never learnt that nothing had started.
        if (children.size === 0 && timers.size === 0) {
          say(`no service left running: each refused its configuration; stopping (exit ${EXIT_CONFIG})`);
          finish(EXIT_CONFIG);
        }
        return;
      }
      const failures = Date.now() - startedAt >= RESTART.healthyAfterMs ? 1 : failuresInARow + 1;
      const delay = restartDelay(failures);
      say(`${name} exited (${signal ?? code}); restarting in ${delay} ms (failure ${failures} in a row)`);
      const t = setTimeout(() => {
        timers.delete(t);
        launch(name, failures);
      }, delay);
      timers.add(t);
    });
  }

  for (const name of names) launch(name, 0);

  const onSignal = () => finish(0);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const exitCode = await finished;
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  stopping = true;
  for (const t of timers) clearTimeout(t);
  const killAfter = killAfterMs(process.env);
  const exits = [...children].map(
    ([name, c]) =>
      new Promise<void>((r) => {
        if (c.exitCode !== null || c.signalCode !== null) return r();
        const kill = setTimeout(() => {
          say(`${name} (pid ${c.pid}) still running ${killAfter} ms after SIGTERM: SIGKILL`);
          c.kill('SIGKILL');
        }, killAfter);
        c.once('exit', () => {
          clearTimeout(kill);
          r();
        });
      }),
  );
  for (const c of children.values()) c.kill('SIGTERM');
  await Promise.all(exits);
  await stack.stop();
  say('stopped');
  return exitCode;
}
