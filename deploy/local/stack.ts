/**
 * The local, Docker-free stack: a single-node Apache Kafka (KRaft) from Maven Central jars and a redis-server,
 * each on a free (or configured) port, with logs in files. Used by `paver dev`, `paver stack` and the test
 * suite's global setup. When KAFKA_BROKERS / REDIS_URL are set, nothing is started.
 */
import {
  spawn,
  spawnSync,
  type ChildProcess,
  type SpawnOptions,
  type StdioNull,
  type StdioPipe,
} from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync, openSync, closeSync } from 'node:fs';
import { createServer, createConnection, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Kafka, logLevel } from 'kafkajs';

export const KAFKA_VERSION = process.env.PAVER_KAFKA_VERSION ?? '3.9.2';

/** The package root, from either deploy/local (vitest) or dist/deploy/local (compiled). */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) dir = dirname(dir);
  return dir;
}

/** Ports this process has handed out: never twice, so a broker and a redis-server started together never share one. */
const handedOut = new Set<number>();

/** The kernel's range for outgoing connections' local ports (Linux), or null where it cannot be read. */
function ephemeralRange(): [number, number] | null {
  try {
    const [lo, hi] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8')
      .trim()
      .split(/\s+/)
      .map(Number);
    return Number.isInteger(lo) && Number.isInteger(hi) ? [lo!, hi!] : null;
  } catch {
    return null;
  }
}

const listens = (port: number) =>
  new Promise<number | null>((res) => {
    const s = createServer();
    s.once('error', () => res(null));
    s.listen(port, '127.0.0.1', () => {
      const got = (s.address() as { port: number }).port;
      s.close(() => res(got));
    });
  });

/**
 * A port free on 127.0.0.1 now, and not handed out before by this process. Taken below the kernel's ephemeral
 * range where it can be read: a port the kernel picks for `listen(0)` comes from the range it also gives the
 * local end of every outgoing connection, so a client connecting between this check and the server's bind could
 * take it (seen: the broker failed to bind a port the stack's redis-server had been given a moment before).
 */
export async function freePort(): Promise<number> {
  const eph = ephemeralRange();
  const lo = 10_000;
  const hi = eph ? eph[0] - 1 : 0;
  for (let i = 0; hi - lo >= 1000 && i < 100; i++) {
    const p = lo + Math.floor(Math.random() * (hi - lo + 1));
    if (handedOut.has(p) || (await listens(p)) === null) continue;
    handedOut.add(p);
    return p;
  }
  for (;;) {
    const p = await listens(0);
    if (p === null) throw new Error('no free TCP port on 127.0.0.1');
    if (handedOut.has(p)) continue;
    handedOut.add(p);
    return p;
  }
}

/** A server that could not bind its port: another process took it after `freePort` found it free. */
class PortTaken extends Error {}
const PORT_TAKEN = /Address already in use/;

/** Starts with ports of its own choosing again (up to 3 times) when a port it chose was taken meanwhile. */
async function onFreePorts<T>(
  chosen: boolean,
  start: () => Promise<T>,
  log: (s: string) => void,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (err) {
      if (!(err instanceof PortTaken) || !chosen || attempt >= 3) throw err;
      log(`${err.message}: starting again on other ports`);
    }
  }
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

function which(cmd: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

export interface Managed {
  name: string;
  child: ChildProcess;
  dir: string;
  logFile: string;
  /** The server's watchdog (see `watch`), ended with the server; null when it could not be started. */
  watchdog: ChildProcess | null;
  stop(): Promise<void>;
}

/**
 * The watchdog's program (run as `node -e`, so it needs no file of its own in either the source or the build):
 * argv is the owner's pid, the server's pid, the grace in ms and the folder to remove ('' for none). It polls
 * both once a second. It exits once the server has ended (the owner stopped it); when the owner has ended
 * first, it sends the server SIGTERM, SIGKILL after the grace, and removes the folder. A zombie server (ended,
 * its owner alive and not yet reaping) still answers signal 0: the watchdog then waits, harmlessly, for the
 * owner to reap it or end.
 */
const WATCHDOG = `
const [owner, server, grace, dir] = process.argv.slice(1);
const alive = (pid) => { try { process.kill(Number(pid), 0); return true; } catch (e) { return e.code === 'EPERM'; } };
const poll = setInterval(() => {
  if (!alive(server)) process.exit(0);
  if (alive(owner)) return;
  clearInterval(poll);
  try { process.kill(Number(server), 'SIGTERM'); } catch {}
  const since = Date.now();
  setInterval(() => {
    if (alive(server) && Date.now() - since < Number(grace)) return;
    try { process.kill(Number(server), 'SIGKILL'); } catch {}
    if (dir) require('node:fs').rmSync(dir, { recursive: true, force: true });
    process.exit(0);
  }, 200);
}, 1000);
`;

/** How long a server is given to stop on SIGTERM before SIGKILL, by its owner or by its watchdog. */
const STOP_GRACE_MS = 10_000;

/**
 * Ends the server when this process ends without stopping it. The servers run in their own process groups
 * (a Ctrl-C must not take them away mid-shutdown), so nothing else would: a `paver dev` or a test run killed
 * with SIGKILL, or by a CI timeout, would leave its broker and redis-server running, each holding a port
 * and a temporary folder. Detached and unreferenced: it outlives this process by design, and never holds it up.
 * Also for the redis-servers tests start of their own (test/helpers/own-redis.ts), whose folders they keep.
 *
 * The watchdog is ended as soon as this process sees the server exit: it knows the server only by its pid,
 * which the system may give to a new process once the server is reaped, and left to its own next poll (up to
 * a second later) it would signal that process if this one had ended meanwhile.
 */
export function watch(child: ChildProcess, dir: string, cleanup: boolean): ChildProcess | null {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return null;
  const dog = spawn(
    process.execPath,
    ['-e', WATCHDOG, String(process.pid), String(child.pid), String(STOP_GRACE_MS), cleanup ? dir : ''],
    { stdio: 'ignore', detached: true },
  );
  dog.on('error', () => undefined);
  dog.unref();
  child.once('exit', () => dog.kill('SIGKILL'));
  return dog;
}

const GATE = 'dir=$1; shift; if read -r _; then exec "$@"; fi; [ -n "$dir" ] && rm -rf -- "$dir"; exit 1';

/**
 * Runs `command` behind a gate: `sh` waits for a line on its stdin, then execs the command (same pid, so
 * signals and `child` are the server's). The watchdog is spawned once the pid is known, and only then the gate
 * opened. An owner killed between the spawn and the watchdog's (no await between them, but a SIGKILL lands
 * anywhere) closes the gate's pipe: the shell reads end of file, removes the folder when it is the stack's
 * to remove, and exits, so no server runs unwatched. Before, the server was spawned first and ran on for ever
 * (the storage format to its end, leaving the folder).
 */
export function spawnWatched(
  command: string,
  args: string[],
  options: Omit<SpawnOptions, 'stdio'> & {
    stdio: [unknown, StdioNull | StdioPipe | number, StdioNull | StdioPipe | number];
  },
  dir: string,
  cleanup: boolean,
): { child: ChildProcess; watchdog: ChildProcess | null } {
  const [, out, err] = options.stdio;
  const child = spawn('sh', ['-c', GATE, 'sh', cleanup ? dir : '', command, ...args], {
    ...options,
    stdio: ['pipe', out, err],
  });
  const watchdog = watch(child, dir, cleanup);
  // A gate whose shell has already gone (it could not start) has nobody to read the line.
  child.stdin?.on('error', () => undefined);
  child.stdin?.end('\n');
  return { child, watchdog };
}

const KEEPER = `trap '' PIPE; dir=$(mktemp -d "$1") || exit 1; echo "$dir"; if read -r _; then exit 0; fi; rm -rf -- "$dir"`;

/**
 * A temporary folder for a start, made by a keeper (\`sh\`, in its own process group) that removes it when this
 * process ends before \`release()\` (its stdin pipe closes). A gate and a watchdog hold the folder only once a
 * process runs behind them: an owner killed after the folder was made and before the first gated spawn, or
 * between the storage format's end and the broker's spawn, left the folder behind. The keeper makes the folder
 * itself, so there is no instant at which it exists without a holder. \`release()\` hands it to the gate, the
 * watchdog and \`stop()\` once the server is spawned; it must be called on every path where a server was spawned (a
 * keeper never released would remove a running server's folder when its owner ends). \`discard()\`, on a start
 * that failed before any spawn, has the keeper remove the folder now: released there, it was nobody's to remove.
 */
async function tempFolder(prefix: string): Promise<{ dir: string; release(): void; discard(): void }> {
  const keeper = spawn('sh', ['-c', KEEPER, 'sh', join(tmpdir(), `${prefix}XXXXXX`)], {
    stdio: ['pipe', 'pipe', 'pipe'],
    detached: true,
  });
  keeper.unref();
  const stdin = keeper.stdin as Socket;
  stdin.on('error', () => undefined);
  // It must not hold this process up: it is ended (released) on every path, and the owner's end is its signal.
  stdin.unref();
  const dir = await new Promise<string>((res, rej) => {
    let out = '';
    let err = '';
    keeper.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('\n')) res(out.slice(0, out.indexOf('\n')));
    });
    keeper.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    keeper.once('error', rej);
    keeper.once('close', () =>
      rej(new Error(`could not make a temporary folder in ${tmpdir()}: ${err.trim()}`)),
    );
  });
  keeper.stdout!.destroy();
  keeper.stderr!.destroy();
  // Closed without a line, the pipe reads as the owner's end: the keeper removes the folder.
  return { dir, release: () => stdin.end('\n'), discard: () => stdin.destroy() };
}

function manage(
  name: string,
  child: ChildProcess,
  watchdog: ChildProcess | null,
  dir: string,
  logFile: string,
  cleanup: boolean,
): Managed {
  let stopping: Promise<void> | null = null;
  return {
    name,
    child,
    dir,
    logFile,
    watchdog,
    stop() {
      stopping ??= (async () => {
        if (child.exitCode === null && child.signalCode === null) {
          const exited = new Promise<void>((r) => child.once('exit', () => r()));
          child.kill('SIGTERM');
          const hard = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
          await exited;
          clearTimeout(hard);
        }
        if (cleanup) rmSync(dir, { recursive: true, force: true });
      })();
      return stopping;
    },
  };
}

/** Copies the broker and its runtime dependencies from Maven Central into a cache folder; reused when present. */
export function fetchKafkaJars(log: (s: string) => void = () => undefined): string {
  const root = packageRoot();
  const cache = resolve(process.env.PAVER_CACHE_DIR ?? join(root, '.cache'));
  const libs = join(cache, `kafka-${KAFKA_VERSION}`, 'libs');
  const marker = join(libs, '.complete');
  if (existsSync(marker)) return libs;
  if (!which('java'))
    throw new Error(
      'java not found: the local Kafka needs Java 17 (or set KAFKA_BROKERS to use your own broker)',
    );
  if (!which('mvn'))
    throw new Error(
      'mvn not found: the local Kafka is fetched with Maven (or set KAFKA_BROKERS to use your own broker)',
    );
  log(`fetching Apache Kafka ${KAFKA_VERSION} jars from Maven Central into ${libs}`);
  mkdirSync(libs, { recursive: true });
  const r = spawnSync(
    'mvn',
    [
      '-B',
      '-q',
      '-f',
      join(root, 'deploy', 'local', 'kafka', 'pom.xml'),
      'dependency:copy-dependencies',
      '-DincludeScope=runtime',
      `-Dkafka.version=${KAFKA_VERSION}`,
      `-DoutputDirectory=${libs}`,
    ],
    { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
  );
  if (r.status !== 0)
    throw new Error(`mvn failed to fetch Kafka jars:\n${(r.stdout + r.stderr).slice(-3000)}`);
  writeFileSync(marker, new Date().toISOString());
  return libs;
}

/**
 * Polls `check` until it holds; `failed` says when waiting is pointless (the process is gone, or its port was
 * taken), so a start that cannot succeed fails at once, not at the deadline.
 */
async function waitFor(
  what: string,
  check: () => Promise<boolean>,
  timeoutMs: number,
  onFail: () => string,
  failed: () => Error | null = () => null,
) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const err = failed();
    if (err) throw err;
    // Each probe is bounded: a port held by some other server may accept and never answer.
    if (await bounded(check, Math.min(5000, Math.max(0, deadline - Date.now())))) return;
    await sleep(200);
  }
  throw new Error(`${what} did not become ready in ${timeoutMs} ms\n${onFail()}`);
}

function bounded(check: () => Promise<boolean>, ms: number): Promise<boolean> {
  return new Promise((res) => {
    const timer = setTimeout(() => res(false), ms);
    check().then(
      (ok) => {
        clearTimeout(timer);
        res(ok);
      },
      () => {
        clearTimeout(timer);
        res(false);
      },
    );
  });
}

/** A KRaft cluster id (16 random bytes, base64url) that does not start with '-', which the CLI would read as an option. */
function clusterId(): string {
  for (;;) {
    const id = randomBytes(16).toString('base64url');
    if (/^[A-Za-z0-9]/.test(id)) return id;
  }
}

export interface KafkaOptions {
  port?: number;
  /** Reuse the controller port of an earlier start on the same `dir` (a restart). */
  controllerPort?: number;
  dir?: string;
  log?: (s: string) => void;
}

export type StartedKafka = Managed & { brokers: string; port: number; controllerPort: number };

export async function startKafka(opts: KafkaOptions = {}): Promise<StartedKafka> {
  const chosen = opts.port === undefined || opts.controllerPort === undefined;
  return onFreePorts(chosen, () => startKafkaOnce(opts), opts.log ?? (() => undefined));
}

/** A bind failure in the broker's logs: it names the port and the address in use. */
function kafkaBindFailure(dir: string, logFile: string): PortTaken | null {
  const text = `${tail(logFile, 200)}\n${tail(join(dir, 'kafka.stdout.log'), 200)}`;
  const line = text.split('\n').find((l) => PORT_TAKEN.test(l) && /bind/i.test(l));
  return line ? new PortTaken(`Kafka: ${line.replace(/^.*?(Socket server failed)/, '$1').trim()}`) : null;
}

/** Writes the broker's configuration into \`dir\`, formats its storage when new, and spawns it. */
async function formatAndSpawnKafka(
  dir: string,
  cleanup: boolean,
  libs: string,
  port: number,
  controller: number,
): Promise<ReturnType<typeof spawnWatched>> {
  mkdirSync(dir, { recursive: true });
  const data = join(dir, 'data');
  const props = join(dir, 'server.properties');
  const log4j = join(dir, 'log4j.properties');
  const logFile = join(dir, 'kafka.log');
  writeFileSync(
    props,
    [
      'process.roles=broker,controller',
      'node.id=1',
      `controller.quorum.voters=1@127.0.0.1:${controller}`,
      `listeners=PLAINTEXT://127.0.0.1:${port},CONTROLLER://127.0.0.1:${controller}`,
      `advertised.listeners=PLAINTEXT://127.0.0.1:${port}`,
      'controller.listener.names=CONTROLLER',
      'inter.broker.listener.name=PLAINTEXT',
      'listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT',
      `log.dirs=${data}`,
      // A single broker cannot hold the default replication factor of 3 for internal topics.
      'offsets.topic.replication.factor=1',
      'offsets.topic.num.partitions=5',
      'transaction.state.log.replication.factor=1',
      'transaction.state.log.min.isr=1',
      'group.initial.rebalance.delay.ms=0',
      'num.partitions=3',
      'auto.create.topics.enable=false',
      'log.cleaner.backoff.ms=1000',
      'log.segment.bytes=67108864',
      '',
    ].join('\n'),
  );
  writeFileSync(
    log4j,
    [
      'log4j.rootLogger=INFO, file',
      'log4j.appender.file=org.apache.log4j.FileAppender',
      `log4j.appender.file.File=${logFile}`,
      'log4j.appender.file.layout=org.apache.log4j.PatternLayout',
      'log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n',
      'log4j.logger.kafka.request.logger=WARN',
      'log4j.logger.state.change.logger=WARN',
      '',
    ].join('\n'),
  );
  const cp = `${libs}/*`;
  const jvm = [
    `-Dlog4j.configuration=file:${log4j}`,
    ...(process.env.KAFKA_HEAP_OPTS ?? '-Xms256m -Xmx768m').split(/\s+/),
    '-XX:+UseSerialGC',
    '-XX:TieredStopAtLevel=1',
  ];
  if (!existsSync(join(data, 'meta.properties'))) {
    // Not spawnSync: the folder would go unwatched until the broker runs, and an owner killed meanwhile (a
    // Ctrl-C or kill -9 in the first seconds of `paver dev`) left it behind. The format runs watched as the
    // servers are, in its own process group like them, so its watchdog ends it and removes the folder; an owner
    // killed before the watchdog exists never opens its gate (`spawnWatched`).
    const fmt = await new Promise<{ status: number | null; stdout: string; stderr: string }>((res) => {
      const { child } = spawnWatched(
        'java',
        [...jvm, '-cp', cp, 'kafka.tools.StorageTool', 'format', '-t', clusterId(), '-c', props],
        { stdio: ['ignore', 'pipe', 'pipe'], detached: true },
        dir,
        cleanup,
      );
      let stdout = '';
      let stderr = '';
      child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
      child.once('error', (err) => res({ status: null, stdout, stderr: `${stderr}${err.message}\n` }));
      child.once('close', (code) => res({ status: code, stdout, stderr }));
    });
    if (fmt.status !== 0) {
      // No server runs yet, so no stop() removes the folder made above: it stayed in the temporary folder after
      // every such failure (a KAFKA_HEAP_OPTS the JVM refuses, a broken jar cache).
      if (cleanup) rmSync(dir, { recursive: true, force: true });
      throw new Error(`kafka storage format failed:\n${fmt.stdout}${fmt.stderr}`);
    }
  }
  const out = openSync(join(dir, 'kafka.stdout.log'), 'a');
  // Its own process group: a terminal's Ctrl-C reaches the whole foreground group, and the broker must
  // outlive the services' graceful stop (commit, leave the group); stop() ends it afterwards.
  try {
    return spawnWatched(
      'java',
      [...jvm, '-cp', cp, 'kafka.Kafka', props],
      { stdio: ['ignore', out, out], detached: true },
      dir,
      cleanup,
    );
  } finally {
    // Never thrown once the broker runs: the caller would take it for a start that spawned nothing, and have its
    // folder removed under it.
    try {
      closeSync(out);
    } catch {
      /* the broker holds its own copy of the descriptor */
    }
  }
}

async function startKafkaOnce(opts: KafkaOptions): Promise<StartedKafka> {
  const libs = fetchKafkaJars(opts.log);
  const port = opts.port ?? (await freePort());
  const controller = opts.controllerPort ?? (await freePort());
  const cleanup = !opts.dir;
  const folder = opts.dir ? null : await tempFolder('paver-kafka-');
  const dir = opts.dir ?? folder!.dir;
  let spawned: ReturnType<typeof spawnWatched>;
  try {
    spawned = await formatAndSpawnKafka(dir, cleanup, libs, port, controller);
  } catch (err) {
    // No broker runs (a configuration not written, a spawn refused): the folder is left to nobody.
    folder?.discard();
    throw err;
  }
  folder?.release();
  const { child, watchdog } = spawned;
  const logFile = join(dir, 'kafka.log');
  const managed = manage('kafka', child, watchdog, dir, logFile, cleanup);
  const brokers = `127.0.0.1:${port}`;
  const admin = new Kafka({
    clientId: 'paver-stack',
    brokers: [brokers],
    logLevel: logLevel.NOTHING,
    retry: { retries: 0 },
    // Each probe is short: a request left unanswered (a port held by another server) holds up disconnect() for
    // as long as this timeout.
    requestTimeout: 5000,
  }).admin();
  try {
    await waitFor(
      'Kafka',
      async () => {
        await admin.connect();
        const meta = await admin.describeCluster();
        if (meta.brokers.length === 0 || meta.controller === null) return false;
        // A group coordinator answers only once __consumer_offsets has leaders: services join groups at once.
        await admin.describeGroups(['paver-stack-probe']);
        return true;
      },
      90_000,
      () => `kafka log (${logFile}):\n${tail(logFile)}\n${tail(join(dir, 'kafka.stdout.log'), 10)}`,
      () =>
        kafkaBindFailure(dir, logFile) ??
        (child.exitCode !== null || child.signalCode !== null
          ? new Error(
              `Kafka exited (${child.exitCode ?? child.signalCode}) before it was ready\nkafka log (${logFile}):\n${tail(logFile)}\n${tail(join(dir, 'kafka.stdout.log'), 10)}`,
            )
          : null),
    );
  } catch (err) {
    await managed.stop();
    throw err;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
  return { ...managed, brokers, port, controllerPort: controller };
}

/** Installs Debian's redis-server when it is missing and we may (root, apt-get present). */
function ensureRedisServer(log: (s: string) => void) {
  if (which('redis-server')) return;
  if (process.getuid?.() === 0 && which('apt-get')) {
    log('redis-server not found: installing Debian package redis-server');
    const r = spawnSync(
      'sh',
      ['-c', 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server'],
      { stdio: 'ignore' },
    );
    if (r.status === 0 && which('redis-server')) return;
  }
  throw new Error(
    'redis-server not found: install it (Debian: apt-get install redis-server) or set REDIS_URL',
  );
}

export async function startRedis(
  opts: { port?: number; log?: (s: string) => void } = {},
): Promise<Managed & { url: string }> {
  ensureRedisServer(opts.log ?? (() => undefined));
  return onFreePorts(opts.port === undefined, () => startRedisOnce(opts.port), opts.log ?? (() => undefined));
}

async function startRedisOnce(wanted: number | undefined): Promise<Managed & { url: string }> {
  const port = wanted ?? (await freePort());
  const folder = await tempFolder('paver-redis-');
  const dir = folder.dir;
  const logFile = join(dir, 'redis.log');
  let spawned: ReturnType<typeof spawnWatched>;
  try {
    spawned = spawnWatched(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        // AOF, fsync every second: a redis-server restart keeps the services' state (at most 1 s lost).
        '--save',
        '',
        '--appendonly',
        'yes',
        '--appendfsync',
        'everysec',
        '--dir',
        dir,
        '--logfile',
        logFile,
        '--daemonize',
        'no',
      ],
      // Its own process group, like the broker: Ctrl-C must not take Redis away mid-shutdown.
      { stdio: ['ignore', 'ignore', 'ignore'], detached: true },
      dir,
      true,
    );
  } catch (err) {
    folder.discard();
    throw err;
  }
  folder.release();
  const { child, watchdog } = spawned;
  const managed = manage('redis', child, watchdog, dir, logFile, true);
  try {
    await waitFor(
      'redis-server',
      () =>
        new Promise<boolean>((res) => {
          if (child.exitCode !== null) return res(false);
          const c = createConnection({ port, host: '127.0.0.1' }, () => c.write('PING\r\n'));
          c.setTimeout(2000, () => {
            c.destroy();
            res(false);
          });
          c.once('data', (d) => {
            c.destroy();
            res(d.toString().startsWith('+PONG'));
          });
          c.once('error', () => res(false));
        }),
      20_000,
      () => tail(logFile),
      () => {
        if (child.exitCode === null && child.signalCode === null) return null;
        const log = tail(logFile);
        return PORT_TAKEN.test(log)
          ? new PortTaken(`redis-server: port ${port} in use`)
          : new Error(
              `redis-server exited (${child.exitCode ?? child.signalCode}) before it was ready\n${log}`,
            );
      },
    );
  } catch (err) {
    await managed.stop();
    throw err;
  }
  return { ...managed, url: `redis://127.0.0.1:${port}` };
}

export interface Stack {
  brokers: string;
  redisUrl: string;
  started: string[];
  stop(): Promise<void>;
}

/** Uses KAFKA_BROKERS / REDIS_URL when set; starts what is missing. */
export async function startStack(
  opts: { env?: NodeJS.ProcessEnv; log?: (s: string) => void; kafkaDir?: string } = {},
): Promise<Stack> {
  const env = opts.env ?? process.env;
  const log = opts.log ?? (() => undefined);
  const started: Managed[] = [];
  try {
    let brokers = env.KAFKA_BROKERS;
    let redisUrl = env.REDIS_URL;
    // Settled, not Promise.all: when one fails, the other is waited for and stopped, never left running.
    const [k, r] = await Promise.allSettled([
      brokers ? null : startKafka({ log, ...(opts.kafkaDir ? { dir: opts.kafkaDir } : {}) }),
      redisUrl ? null : startRedis({ log }),
    ]);
    for (const s of [k, r]) if (s.status === 'fulfilled' && s.value) started.push(s.value);
    if (k.status === 'rejected') throw k.reason;
    if (r.status === 'rejected') throw r.reason;
    if (k.value) brokers = k.value.brokers;
    if (r.value) redisUrl = r.value.url;
    return {
      brokers: brokers!,
      redisUrl: redisUrl!,
      started: started.map((m) => m.name),
      stop: async () => {
        await Promise.all(started.map((m) => m.stop()));
      },
    };
  } catch (err) {
    await Promise.all(started.map((m) => m.stop()));
    throw err;
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  // `node dist/deploy/local/stack.js` — foreground stack until Ctrl-C (also `npx paver stack`).
  const stack = await startStack({ log: (s) => process.stderr.write(`${s}\n`) });
  process.stdout.write(`KAFKA_BROKERS=${stack.brokers}\nREDIS_URL=${stack.redisUrl}\n`);
  const stop = () => void stack.stop().then(() => process.exit(0));
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}
