import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { freePort, startKafka, startRedis, startStack } from '../../deploy/local/stack.js';

/** This process's child processes by command name (the stack's servers are spawned from here). */
const children = (): string[] => {
  try {
    return execFileSync('ps', ['-o', 'comm=', '--ppid', String(process.pid)], { encoding: 'utf8' })
      .split('\n')
      .map((l) => l.trim())
      .filter((c) => c === 'java' || c === 'redis-server');
  } catch {
    return []; // ps exits 1 when there is no child
  }
};

const held: Server[] = [];
const accepted: Socket[] = [];
/** Holds the port as another program would: it accepts connections and never answers them. */
const hold = async (port: number) => {
  const s = createServer((c) => accepted.push(c));
  await new Promise<void>((r) => s.listen(port, '127.0.0.1', r));
  held.push(s);
};
const dirs: string[] = [];

afterEach(async () => {
  for (const c of accepted.splice(0)) c.destroy();
  await Promise.all(held.splice(0).map((s) => new Promise((r) => s.close(r))));
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe('local stack start-up', () => {
  it('stops the redis-server it started when the broker fails, and says why the broker failed', async () => {
    // A data folder formatted for another node: the broker exits at start-up, after redis-server is up.
    const dir = mkdtempSync(join(tmpdir(), 'paver-stack-test-'));
    dirs.push(dir);
    mkdirSync(join(dir, 'data'), { recursive: true });
    writeFileSync(
      join(dir, 'data', 'meta.properties'),
      'version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=7\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAA\n',
    );
    expect(children()).toEqual([]);
    const err = await startStack({ env: {}, kafkaDir: dir }).then(
      () => new Error('started'),
      (e: Error) => e,
    );
    expect(children()).toEqual([]);
    expect(err.message).toMatch(/^Kafka exited/);
  });

  it('names a redis-server port that is taken, at once', async () => {
    const port = await freePort();
    await hold(port);
    await expect(startRedis({ port })).rejects.toThrow(`redis-server: port ${port} in use`);
    expect(children()).toEqual([]);
  });

  it('names a broker port that is taken, at once', async () => {
    const port = await freePort();
    await hold(port);
    await expect(startKafka({ port, controllerPort: await freePort() })).rejects.toThrow(
      new RegExp(`Kafka: Socket server failed to bind to 127.0.0.1:${port}`),
    );
    expect(children()).toEqual([]);
  });
});
