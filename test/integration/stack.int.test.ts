import { execFileSync, spawn } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { freePort, startKafka, startRedis, startStack } from '../../deploy/local/stack.js';
import { waitFor } from '../helpers/kafka.js';
import { alive, PAVER_BIN, ROOT } from '../helpers/process.js';

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

/** A process's children: pid and full command line (from /proc: `ps` cuts long ones, such as the broker's). */
const childrenOf = (pid: number): { pid: number; args: string }[] => {
  let pids: number[];
  try {
    pids = execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map(Number);
  } catch {
    return []; // ps exits 1 when there is no child
  }
  return pids.map((p) => {
    try {
      return { pid: p, args: readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').join(' ') };
    } catch {
      return { pid: p, args: '' };
    }
  });
};

const accepts = (port: number) =>
  new Promise<boolean>((res) => {
    const c = createConnection({ port, host: '127.0.0.1' }, () => {
      c.destroy();
      res(true);
    });
    c.once('error', () => res(false));
  });

const held: Server[] = [];
const accepted: Socket[] = [];
/** Holds the port as another program would: it accepts connections and never answers them. */
const hold = async (port: number) => {
  const s = createServer((c) => accepted.push(c));
  await new Promise<void>((r) => s.listen(port, '127.0.0.1', r));
  held.push(s);
};
const dirs: string[] = [];

const stackTs = join(ROOT, 'deploy', 'local', 'stack.ts');

/**
 * Runs `code` (a module that imports the stack) as an owner process whose temporary folders go under `tmp`;
 * resolves once it has exited, with all it printed.
 */
async function runOwner(
  code: string,
  tmp: string,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }> {
  const owner = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? '',
      HOME: process.env.HOME ?? '/tmp',
      PAVER_CACHE_DIR: process.env.PAVER_CACHE_DIR ?? join(ROOT, '.cache'),
      TMPDIR: tmp,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  owner.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  owner.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const [exitCode, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((r) =>
    owner.once('exit', (c, sig) => r([c, sig])),
  );
  return { code: exitCode, signal, out };
}

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

  it('removes the broker folder it made when the broker cannot even format its storage', async () => {
    // A heap the JVM refuses: kafka-storage format fails, before any server runs.
    const tmp = mkdtempSync(join(tmpdir(), 'paver-stack-tmp-'));
    dirs.push(tmp);
    const run = spawn(process.execPath, [PAVER_BIN, 'stack'], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '/tmp',
        PAVER_CACHE_DIR: process.env.PAVER_CACHE_DIR ?? join(ROOT, '.cache'),
        TMPDIR: tmp,
        KAFKA_HEAP_OPTS: '-Xmx1k',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    run.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((r) => run.once('exit', (c) => r(c)));
    expect(err).toContain('kafka storage format failed');
    expect(code).not.toBe(0);
    // Before: paver-kafka-XXXXXX (its server.properties) stayed in the temporary folder after every such start.
    expect(readdirSync(tmp)).toEqual([]);
  });

  it('removes the broker folder when its process is killed while the broker storage is being formatted', async () => {
    const tmp = mkdtempSync(join(tmpdir(), 'paver-stack-tmp-'));
    dirs.push(tmp);
    // A java that holds the storage format until it is ended (and says its pid), so the kill lands inside it.
    const bin = join(tmp, 'bin');
    mkdirSync(bin);
    const marker = join(bin, 'formatting.pid');
    const java = execFileSync('sh', ['-c', 'command -v java'], { encoding: 'utf8' }).trim();
    writeFileSync(
      join(bin, 'java'),
      `#!/bin/sh\ncase "$*" in *StorageTool*) echo $$ > "${marker}"; exec sleep 600;; esac\nexec ${java} "$@"\n`,
      { mode: 0o755 },
    );
    const owner = spawn(process.execPath, [PAVER_BIN, 'stack'], {
      cwd: ROOT,
      env: {
        PATH: `${bin}:${process.env.PATH ?? ''}`,
        HOME: process.env.HOME ?? '/tmp',
        PAVER_CACHE_DIR: process.env.PAVER_CACHE_DIR ?? join(ROOT, '.cache'),
        TMPDIR: tmp,
      },
      stdio: 'ignore',
    });
    const exited = new Promise<void>((r) => owner.once('exit', () => r()));
    let formatter = 0;
    try {
      formatter = await waitFor(
        () => existsSync(marker) && Number(readFileSync(marker, 'utf8').trim()),
        'the storage format to start',
      );
      // The format's watchdog is spawned right after it, but the fake java above may write its pid first: a kill
      // in between (seen once on a loaded machine) tests an owner gone before any watchdog existed. Its argv
      // names the pid it watches.
      await waitFor(
        () =>
          childrenOf(owner.pid!).some((c) => c.args.includes(' -e ') && c.args.includes(` ${formatter} `)),
        "the storage format's watchdog to start",
      );
      owner.kill('SIGKILL');
      await exited;
      // Before: nothing watched the folder until the broker ran: it stayed, and so did the format.
      await waitFor(
        () => readdirSync(tmp).filter((f) => f.startsWith('paver-')).length === 0 && !alive(formatter),
        'the broker folder removed and the format ended',
        30_000,
      );
    } finally {
      if (owner.exitCode === null && owner.signalCode === null) owner.kill('SIGKILL');
      if (formatter && alive(formatter)) process.kill(formatter, 'SIGKILL');
    }
  });

  it.each(['format', 'redis'] as const)(
    'leaves nothing behind when its process is killed between spawning a %s process and spawning its watchdog',
    async (what) => {
      const tmp = mkdtempSync(join(tmpdir(), 'paver-stack-tmp-'));
      dirs.push(tmp);
      // The owner's spawn is wrapped so that the process kills itself (SIGKILL) as the watchdog is about to be
      // spawned, having said the pids it spawned before: the instant no test from outside can hit.
      const code = `
        import cp from 'node:child_process';
        import { writeSync } from 'node:fs';
        import { syncBuiltinESMExports } from 'node:module';
        const spawn = cp.spawn;
        const pids = [];
        cp.spawn = (cmd, args, opts) => {
          if (cmd === process.execPath && args[0] === '-e') {
            writeSync(1, 'spawned ' + pids.join(' ') + '\\n');
            process.kill(process.pid, 'SIGKILL');
            for (;;);
          }
          const child = spawn(cmd, args, opts);
          pids.push(child.pid);
          return child;
        };
        syncBuiltinESMExports();
        const stack = await import(${JSON.stringify(stackTs)});
        await stack.${what === 'format' ? 'startKafka' : 'startRedis'}();`;
      const { signal, out } = await runOwner(code, tmp);
      expect(signal).toBe('SIGKILL');
      const pids = (/spawned ([\d ]+)/.exec(out)?.[1] ?? '').trim().split(' ').map(Number);
      expect(pids.length, out).toBeGreaterThan(0);
      try {
        // Before: the process ran on unwatched (redis-server for ever, the format to its end), and its folder stayed.
        await waitFor(
          () =>
            pids.every((p) => !alive(p)) &&
            readdirSync(tmp).filter((f) => f.startsWith('paver-')).length === 0,
          `the ${what} process ended and its folder removed`,
          20_000,
        );
      } finally {
        for (const p of pids) if (alive(p)) process.kill(p, 'SIGKILL');
      }
    },
  );

  it.each([
    ['after making the broker folder, before spawning the storage format', 'kafka', 1],
    ['after the storage format ended, before spawning the broker', 'kafka', 2],
    ['after making the redis-server folder, before spawning redis-server', 'redis', 1],
  ] as const)('leaves no folder behind when its process is killed %s', async (_moment, what, nth) => {
    const tmp = mkdtempSync(join(tmpdir(), 'paver-stack-tmp-'));
    dirs.push(tmp);
    // The owner kills itself (SIGKILL) as it is about to spawn its nth gated process: after the folder was
    // made (and, for the broker, after the format ended and its watchdog went), before any gate holds it.
    const code = `
        import cp from 'node:child_process';
        import { syncBuiltinESMExports } from 'node:module';
        const spawn = cp.spawn;
        let gates = 0;
        cp.spawn = (cmd, args, opts) => {
          if (cmd === 'sh' && String(args[1]).includes('exec "$@"') && ++gates === ${nth}) {
            process.kill(process.pid, 'SIGKILL');
            for (;;);
          }
          return spawn(cmd, args, opts);
        };
        syncBuiltinESMExports();
        const stack = await import(${JSON.stringify(stackTs)});
        await stack.${what === 'kafka' ? 'startKafka' : 'startRedis'}();`;
    const { signal, out } = await runOwner(code, tmp);
    expect(signal, out).toBe('SIGKILL');
    // Before: nothing held the folder in these moments, and it stayed.
    await waitFor(
      () => readdirSync(tmp).filter((f) => f.startsWith('paver-')).length === 0,
      `the ${what} folder removed (left: ${readdirSync(tmp).join(', ')})`,
      20_000,
    );
  });

  it.each([
    ['the storage format', 'kafka', 1],
    ['the broker (its storage formatted)', 'kafka', 2],
    ['redis-server', 'redis', 1],
  ] as const)('leaves no folder behind when spawning %s throws', async (_what, what, nth) => {
    const tmp = mkdtempSync(join(tmpdir(), 'paver-stack-tmp-'));
    dirs.push(tmp);
    // A spawn refused at once (E2BIG, ENOMEM; a configuration file not written fails the same way): no server runs,
    // and the start fails. Before, the keeper was released all the same, and the folder stayed with nobody to
    // remove it.
    const code = `
        import cp from 'node:child_process';
        import { syncBuiltinESMExports } from 'node:module';
        const spawn = cp.spawn;
        let gates = 0;
        cp.spawn = (cmd, args, opts) => {
          if (cmd === 'sh' && String(args[1]).includes('exec "$@"') && ++gates === ${nth})
            throw Object.assign(new Error('spawn E2BIG'), { code: 'E2BIG' });
          return spawn(cmd, args, opts);
        };
        syncBuiltinESMExports();
        const stack = await import(${JSON.stringify(stackTs)});
        try {
          const s = await stack.${what === 'kafka' ? 'startKafka' : 'startRedis'}();
          await s.stop();
          process.exit(0);
        } catch (err) {
          process.stderr.write(String(err) + '\\n');
          process.exit(3);
        }`;
    const { code: exit, out } = await runOwner(code, tmp);
    expect({ exit, refused: out.includes('E2BIG') }, out).toEqual({ exit: 3, refused: true });
    await waitFor(
      () => readdirSync(tmp).filter((f) => f.startsWith('paver-')).length === 0,
      `the ${what} folder removed (left: ${readdirSync(tmp).join(', ')})`,
      20_000,
    );
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

  it('ends its broker and redis-server, and removes their folders, when its process is killed', async () => {
    const { KAFKA_BROKERS: _k, REDIS_URL: _r, ...env } = process.env;
    const owner = spawn(process.execPath, [PAVER_BIN, 'stack'], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    owner.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    owner.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<void>((r) => owner.once('exit', () => r()));
    try {
      const urls = await waitFor(
        () => /KAFKA_BROKERS=127\.0\.0\.1:(\d+)\nREDIS_URL=redis:\/\/127\.0\.0\.1:(\d+)/.exec(out),
        `the stack's addresses (output so far: ${out})`,
        180_000,
      );
      const ports = [Number(urls[1]), Number(urls[2])];
      const servers = childrenOf(owner.pid!).filter((c) => /kafka\.Kafka|redis-server/.test(c.args));
      expect(servers).toHaveLength(2);
      // Both folders are temporary here: the broker's holds its log4j config; redis-server runs in its --dir
      // (it rewrites its own command line, so the folder is read as its working directory).
      const kafka = servers.find((c) => c.args.includes('kafka.Kafka'))!;
      const redis = servers.find((c) => c !== kafka)!;
      const kafkaDir = dirname(/log4j\.configuration=file:(\S+)/.exec(kafka.args)![1]!);
      const redisDir = readlinkSync(`/proc/${redis.pid}/cwd`);
      expect(redisDir).toMatch(/paver-redis-/);
      expect(kafkaDir).toMatch(/paver-kafka-/);
      for (const f of [redisDir, kafkaDir]) expect(existsSync(f)).toBe(true);
      for (const p of ports) expect(await accepts(p)).toBe(true);

      owner.kill('SIGKILL');
      await exited;
      await waitFor(
        () => servers.every((c) => !alive(c.pid)),
        `the servers to end after their owner was killed: ${servers
          .filter((c) => alive(c.pid))
          .map((c) => c.args.slice(0, 60))
          .join('; ')}`,
        60_000,
      );
      for (const p of ports) expect(await accepts(p)).toBe(false);
      await waitFor(
        () => !existsSync(redisDir) && !existsSync(kafkaDir),
        'the temporary folders to be removed',
        30_000,
      );
    } finally {
      owner.kill('SIGKILL');
    }
  });

  it('ends the watchdog with its server, so that it never outlives the pid it watches', async () => {
    // Stopped by its owner, and ended from outside: either way the watchdog must be gone at once, not at its
    // next poll, when the server's pid may already belong to another process.
    for (const end of ['stop', 'killed'] as const) {
      const redis = await startRedis();
      const dog = redis.watchdog;
      try {
        expect(dog?.pid).toBeGreaterThan(0);
        expect(alive(dog!.pid!)).toBe(true);
        if (end === 'stop') await redis.stop();
        else redis.child.kill('SIGKILL');
        await waitFor(
          () => dog!.exitCode !== null || dog!.signalCode !== null,
          `the watchdog to end (${end})`,
        );
        // Killed by its owner: had it ended by itself (its poll found the server gone) it would exit with 0.
        expect(dog!.signalCode).toBe('SIGKILL');
      } finally {
        await redis.stop();
      }
    }
  });

  it("ends a test's own redis-server, and keeps its folder, when the test process is killed", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-own-redis-'));
    dirs.push(dir);
    const helper = join(ROOT, 'test', 'helpers', 'own-redis.ts');
    const code = `const { ownRedis } = await import(${JSON.stringify(helper)});
      const r = await ownRedis(undefined, ${JSON.stringify(dir)});
      process.stdout.write('started ' + r.child.pid + ' ' + r.port + '\\n');
      setInterval(() => undefined, 60_000);`;
    const owner = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    owner.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    owner.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<void>((r) => owner.once('exit', () => r()));
    let pid = 0;
    try {
      const m = await waitFor(() => /started (\d+) (\d+)/.exec(out), `ownRedis in a child (output: ${out})`);
      pid = Number(m[1]);
      const port = Number(m[2]);
      expect(await accepts(port)).toBe(true);
      owner.kill('SIGKILL');
      await exited;
      await waitFor(
        () => !alive(pid),
        `the redis-server (pid ${pid}) to end after its owner was killed`,
        30_000,
      );
      expect(await accepts(port)).toBe(false);
      // The folder is the test's: its append-only file is what a restart of the server would read.
      expect(existsSync(join(dir, 'appendonlydir'))).toBe(true);
    } finally {
      owner.kill('SIGKILL');
      if (pid && alive(pid)) process.kill(pid, 'SIGKILL');
    }
  });
});
