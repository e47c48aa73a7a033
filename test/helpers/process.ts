import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../deploy/local/stack.js';
import { stack, unique, waitFor } from './kafka.js';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const PAVER_BIN = fileURLToPath(new URL('../../bin/paver.js', import.meta.url));

/** Environment for a service under test: its own topics, consumer group and Redis key prefix. */
export function serviceEnv(overrides: Record<string, string> = {}): Record<string, string> {
  const id = unique('t');
  return {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '/tmp',
    KAFKA_BROKERS: stack().brokers,
    REDIS_URL: stack().redisUrl,
    REDIS_KEY_PREFIX: `test:${id}`,
    PAVER_TOPIC_TOOL_CALLS: `${id}.tool-calls`,
    PAVER_TOPIC_FLOW_CANDIDATES: `${id}.flow-candidates`,
    PAVER_TOPIC_NEXT_ACTIONS: `${id}.next-actions`,
    PAVER_TOPIC_SEQUENCE_STATE: `${id}.sequence-state`,
    PAVER_TOPIC_FLOW_SELECTIONS: `${id}.flow-selections`,
    PAVER_TOPIC_DEAD_LETTERS: `${id}.dead-letters`,
    AUTOSEQ_RULES_TOPIC: `${id}.autoseq-rules`,
    SEQUENCER_STATE_TOPIC: `${id}.sequencer-sessions`,
    DETECTOR_GROUP_ID: `${id}-detector`,
    KAFKA_SESSION_TIMEOUT_MS: '10000',
    LOG_LEVEL: 'info',
    ...overrides,
  };
}

export interface Proc {
  child: ChildProcess;
  port: number;
  output: () => string;
  exited: Promise<number | null>;
  url: (path: string) => string;
}

/** Starts `paver <args>` (or a node script) as a real process with its own HTTP port. */
export async function startProcess(args: string[], env: Record<string, string>): Promise<Proc> {
  const port = await freePort();
  let out = '';
  const child = spawn(process.execPath, args, {
    cwd: ROOT,
    env: { ...env, HTTP_PORT: String(port) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  return { child, port, output: () => out, exited, url: (p) => `http://127.0.0.1:${port}${p}` };
}

/** `w`, whose failure carries the process's last output: a failed wait says what the process logged. */
export const explained = <T>(p: Proc, w: Promise<T>) =>
  w.catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output().slice(-6000)}`);
  });

/**
 * `startProcess(args, env)`, kept in `procs` (for killAll), once its /readyz answers 200 within `ms`: a process
 * that never gets ready fails the wait with its last output.
 */
export async function startReady(
  args: string[],
  env: Record<string, string>,
  procs: Proc[],
  ms = 60_000,
): Promise<Proc> {
  const p = await startProcess(args, env);
  procs.push(p);
  await explained(
    p,
    waitFor(() => isReady(p), `${args.at(-1)} /readyz`, ms),
  );
  return p;
}

/**
 * SIGTERM, then the exit code, which must come within `ms` (far below the `PAVER_SHUTDOWN_TIMEOUT_MS` the stop
 * tests set): a stop that waited for its work would time out here, with the process's last output.
 */
export async function stopPromptly(p: Proc, ms = 30_000): Promise<number | null> {
  p.child.kill('SIGTERM');
  await waitFor(() => p.child.exitCode !== null, 'exit after SIGTERM', ms).catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output().slice(-3000)}`);
  });
  return p.exited;
}

export async function getJson(url: string): Promise<{ status: number; body: unknown }> {
  const res = await fetch(url);
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // plain text (metrics)
  }
  return { status: res.status, body };
}

export async function isReady(p: Proc): Promise<boolean> {
  try {
    return (await fetch(p.url('/readyz'))).status === 200;
  } catch {
    return false;
  }
}

/**
 * SIGKILLs every process of `procs` still running, waits for each to be gone, and empties the list: for an
 * `afterEach`. A test's services left running until the file's end keep fetching, heartbeating and polling lag
 * on the shared broker, and by the last tests of a file there were a dozen of them: on a loaded machine, load
 * enough to starve the tests that follow.
 */
export async function killAll(procs: Proc[]): Promise<void> {
  const live = procs.splice(0);
  for (const p of live) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
  await Promise.all(live.map((p) => p.exited));
}

/** Whether a process with this pid exists (a zombie counts: it is gone once its parent reaps it). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
