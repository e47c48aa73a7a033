import { spawn, type ChildProcess } from 'node:child_process';
import { Redis } from 'ioredis';
import { freePort } from '../../deploy/local/stack.js';
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
  const p = port ?? (await freePort());
  const persistence = dir
    ? ['--appendonly', 'yes', '--appendfsync', 'always', '--dir', dir]
    : ['--appendonly', 'no'];
  const child = spawn('redis-server', ['--port', String(p), '--save', '', ...persistence], {
    stdio: 'ignore',
  });
  started.push(child);
  const probe = new Redis(p, '127.0.0.1', {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  probe.on('error', () => undefined);
  await waitFor(async () => {
    try {
      if (probe.status !== 'ready') await probe.connect();
      return (await probe.ping()) === 'PONG';
    } catch {
      probe.disconnect();
      return false;
    }
  }, `redis-server on ${p}`);
  probe.disconnect();
  return { child, port: p, url: `redis://127.0.0.1:${p}` };
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
