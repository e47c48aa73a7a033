import type { ChildProcess } from 'node:child_process';
import { Redis } from 'ioredis';
import { freePort, spawnWatched } from '../../deploy/local/stack.js';
import { waitFor } from './kafka.js';

export interface OwnRedis {
  child: ChildProcess;
  port: number;
  url: string;
}

const started: ChildProcess[] = [];

/**
 * A redis-server of the test's own, on a free port (or `port`, to start one again where it was), to stop, freeze
 * and start again. With a folder, an append-only file: what the test recorded survives a restart of this server.
 */
export async function ownRedis(port?: number, dir?: string): Promise<OwnRedis> {
  // A port found free can be taken before redis-server binds it: then it exits, and another port is tried.
  for (let attempt = 1; ; attempt++) {
    const p = port ?? (await freePort());
    const started = await startOn(p, dir);
    if (started) return started;
    if (port !== undefined || attempt >= 3) throw new Error(`redis-server on ${p} exited before it answered`);
  }
}

async function startOn(p: number, dir?: string): Promise<OwnRedis | null> {
  const persistence = dir
    ? ['--appendonly', 'yes', '--appendfsync', 'always', '--dir', dir]
    : ['--appendonly', 'no'];
  // A test run killed outright (SIGKILL, a CI timeout) never reaches stopOwnRedis: without its watchdog, the
  // server stays.
  const { child } = spawnWatched(
    'redis-server',
    ['--port', String(p), '--save', '', ...persistence],
    { stdio: ['ignore', 'ignore', 'ignore'] },
    dir ?? '',
    false,
  );
  started.push(child);
  const probe = new Redis(p, '127.0.0.1', {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  probe.on('error', () => undefined);
  try {
    await waitFor(async () => {
      if (child.exitCode !== null) return true;
      try {
        if (probe.status !== 'ready') await probe.connect();
        return (await probe.ping()) === 'PONG';
      } catch {
        probe.disconnect();
        return false;
      }
    }, `redis-server on ${p}`);
  } finally {
    probe.disconnect();
  }
  return child.exitCode === null ? { child, port: p, url: `redis://127.0.0.1:${p}` } : null;
}

/** Stops every server `ownRedis` started that still runs (a frozen one is thawed first); for `afterAll`. */
export function stopOwnRedis(): void {
  for (const s of started.splice(0)) {
    if (s.exitCode === null && s.signalCode === null) {
      s.kill('SIGCONT');
      s.kill('SIGKILL');
    }
  }
}
