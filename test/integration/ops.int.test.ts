import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, createServer, type Socket } from 'node:net';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../deploy/local/stack.js';
import { commonEnvSchema, parseEnv } from '../../shared/config.js';
import { classifyError, errorMessage } from '../../shared/errors.js';
import { silentLogger } from '../../shared/log.js';
import { createRedis, createRoleProbe } from '../../shared/redis/client.js';
import { groupCaughtUp, produce, stack, testRedis, unique, waitFor } from '../helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../helpers/own-redis.js';
import { explained, serviceEnv, startProcess, type Proc } from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';
import { createRecorderTopics, RECORDER, recorderEvent as event } from '../helpers/recorder.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs)
    if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
  stopOwnRedis();
});

/** The recorder started on `env`, killed at the file's end if still running. */
async function startRecorder(env: Record<string, string>): Promise<Proc> {
  const p = await startProcess(RECORDER, env);
  procs.push(p);
  return p;
}

/** Events `from` … `from + n - 1` to `topic`, each keyed by its own session. */
const sendEvents = (topic: string, from: number, n: number) =>
  produce(
    topic,
    Array.from({ length: n }, (_, i) => ({ key: `s${from + i}`, value: JSON.stringify(event(from + i)) })),
  );

/** An admin client of the redis-server on `port`; its connection errors are the test's to provoke. */
function adminClient(port: number): Redis {
  const c = new Redis(port, '127.0.0.1', { maxRetriesPerRequest: 2 });
  c.on('error', () => undefined);
  return c;
}

/**
 * Two redis-servers of this test's own, each in a folder of its own (the full sync that REPLICAOF starts writes
 * an RDB file in the server's folder), with an admin client each; `stop` kills both and removes the folders.
 */
async function redisPair() {
  const dirs = [0, 1].map(() => mkdtempSync(join(tmpdir(), 'paver-ops-pair-')));
  const [a, b] = [await ownRedis(undefined, dirs[0]), await ownRedis(undefined, dirs[1])];
  const [adminA, adminB] = [adminClient(a.port), adminClient(b.port)];
  const stop = async () => {
    for (const c of [adminA, adminB]) c.disconnect();
    for (const s of [a, b]) s.child.kill('SIGKILL');
    await Promise.all(
      [a, b].map((s) =>
        waitFor(() => s.child.exitCode !== null || s.child.signalCode !== null, 'redis-server gone'),
      ),
    );
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  };
  return { a, b, adminA, adminB, stop };
}

/**
 * B made a replica of A, events 0 … n-1 sent, the recorder started on `env`: resolves once A has recorded them
 * all and B holds them too.
 */
async function recorderWithReplica(
  pair: Awaited<ReturnType<typeof redisPair>>,
  env: Record<string, string>,
  n: number,
): Promise<Proc> {
  const topic = env.PAVER_TOPIC_TOOL_CALLS!;
  const seen = `${env.REDIS_KEY_PREFIX!}:seen`;
  await createRecorderTopics(env, 1);
  await pair.adminB.call('REPLICAOF', '127.0.0.1', String(pair.a.port));
  await sendEvents(topic, 0, n);
  const p = await startRecorder(env);
  await explained(
    p,
    waitFor(async () => (await pair.adminA.scard(seen)) === n, `the first ${n} on A`, 90_000),
  );
  await waitFor(
    async () =>
      /master_link_status:up/.test(await pair.adminB.info('replication')) &&
      (await pair.adminB.scard(seen)) === n,
    'B in sync with A',
  );
  return p;
}

/** One request, answered within `ms` or not at all (a timeout answers null). */
async function probe(url: string, ms: number): Promise<{ status: number; body: unknown } | null> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(ms) });
    const text = await res.text();
    return { status: res.status, body: JSON.parse(text) as unknown };
  } catch {
    return null;
  }
}

/** `p`'s outcome, or `fallback` once `ms` have passed: a guard far above a deadline, so a hang fails the test. */
async function within<T, F>(p: Promise<T>, ms: number, fallback: F): Promise<T | F> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<F>((r) => (timer = setTimeout(() => r(fallback), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Until /readyz answers 200, the process's output in the error otherwise. */
const untilReady = (p: Proc, what: string, ms: number) =>
  explained(
    p,
    waitFor(async () => (await probe(p.url('/readyz'), 2_000))?.status === 200, what, ms),
  );

/** Until /readyz answers 503, its answer; the process's output in the error otherwise. */
const untilNotReady = (p: Proc, what: string, ms: number) =>
  explained(
    p,
    waitFor(
      async () => {
        const res = await probe(p.url('/readyz'), 5_000);
        return res?.status === 503 ? res : null;
      },
      what,
      ms,
    ),
  );

/** SIGTERM (or `signal`): the process stops gracefully, exit 0. */
async function expectCleanStop(p: Proc, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  p.child.kill(signal);
  expect(await exitWithin(p, 30_000)).toBe(0);
}

/** Until `check` holds the first chunk (PAVER_BATCH_CHUNK 10) of the events, the process's output otherwise. */
const untilFirstChunk = (p: Proc, check: Redis, env: Record<string, string>) =>
  explained(
    p,
    waitFor(
      async () => (await check.scard(`${env.REDIS_KEY_PREFIX!}:seen`)) >= 10,
      'the first chunk',
      90_000,
    ),
  );

/** The recorder started again on `env` (without a delay per chunk): resolves once `check` holds all `n` events. */
async function restartUntilAll(env: Record<string, string>, check: Redis, n: number): Promise<Proc> {
  const again = await startRecorder({ ...env, FIXTURE_DELAY_MS: '0' });
  await explained(
    again,
    waitFor(
      async () => (await check.scard(`${env.REDIS_KEY_PREFIX!}:seen`)) === n,
      `all ${n} events`,
      90_000,
    ),
  );
  return again;
}

/** Once the consumer group of `env` has caught up: the recorder's deliveries per event id in `redis`. */
async function deliveriesCaughtUp(
  env: Record<string, string>,
  redis: Redis,
): Promise<Record<string, string>> {
  await waitFor(() => groupCaughtUp(env.FIXTURE_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!), 'caught up');
  return redis.hgetall(`${env.REDIS_KEY_PREFIX!}:deliveries`);
}

/** The events of `before` whose delivery count is no longer the same in `after`: read again. */
const redelivered = (before: Record<string, string>, after: Record<string, string>) =>
  Object.keys(before).filter((id) => after[id] !== before[id]);

/** A metric's value (summed over its series) from the process's /metrics. */
const metric = async (p: Proc, name: string) =>
  parsePrometheus(await fetch(p.url('/metrics')).then((r) => r.text())).value(name);

/** Resolves the exit code, or 'running' if the process is still up after `ms`. */
const exitWithin = (p: Proc, ms: number) =>
  Promise.race([p.exited, new Promise<'running'>((r) => setTimeout(() => r('running'), ms))]);

describe('operations: start-up, shutdown and dependency outages (real Kafka, real Redis, real processes)', () => {
  it('while the broker cannot be reached at start-up, /healthz answers and /readyz says why; SIGTERM ends the start-up at once', async () => {
    const dead = await freePort();
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), KAFKA_BROKERS: `127.0.0.1:${dead}` });
    const p = await startRecorder(env);
    // Liveness is the process's, never its dependencies': a start-up waiting for Kafka is alive.
    await explained(
      p,
      waitFor(async () => (await probe(p.url('/healthz'), 2_000))?.status === 200, '/healthz 200', 20_000),
    );
    const ready = await probe(p.url('/readyz'), 2_000);
    expect(ready?.status).toBe(503);
    expect((ready?.body as { ready: boolean }).ready).toBe(false);
    p.child.kill('SIGTERM');
    // Before, the signal waited for the start-up's retries against the broker (minutes), past any grace period.
    expect(await exitWithin(p, 10_000)).toBe(0);
    expect(p.output()).not.toContain('"msg":"consuming"');
  }, 60_000);

  it('a second SIGTERM during the graceful stop does not cut it short: the chunk in hand is finished and committed, exit 0', async () => {
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      FIXTURE_DELAY_MS: '3000',
      PAVER_BATCH_CHUNK: '10',
    });
    await createRecorderTopics(env, 1);
    await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 60);
    const check = testRedis();
    const prefix = env.REDIS_KEY_PREFIX!;
    try {
      const p = await startRecorder(env);
      // The first chunk is written: the next one is in hand (3 s each).
      await untilFirstChunk(p, check, env);
      p.child.kill('SIGTERM');
      await waitFor(() => p.output().includes('"msg":"shutting down"'), 'the stop to begin');
      // A second signal (an impatient operator, a supervisor that repeats it) while the chunk is finishing.
      await expectCleanStop(p);
      expect(p.output()).toContain('"msg":"stopped"');
      const before = await check.hgetall(`${prefix}:deliveries`);

      // What was written before the stop was committed: the next run reads only the rest.
      const again = await restartUntilAll(env, check, 60);
      expect(redelivered(before, await deliveriesCaughtUp(env, check))).toEqual([]);
      await expectCleanStop(again, 'SIGINT');
    } finally {
      check.disconnect();
    }
  }, 240_000);

  it('a frozen Redis fails a command with "Command timed out" after REDIS_COMMAND_TIMEOUT_MS, as a transient error; after the thaw the same connection answers, in step', async () => {
    const r = await ownRedis();
    const env = parseEnv(commonEnvSchema, {
      KAFKA_BROKERS: stack().brokers,
      REDIS_URL: r.url,
      REDIS_COMMAND_TIMEOUT_MS: '500',
    });
    const redis = createRedis(env, silentLogger());
    try {
      await redis.connect();
      await redis.set('k', 'before');
      // Redis stops answering without closing its connection: the kernel keeps acknowledging, TCP never fails.
      r.child.kill('SIGSTOP');
      // Before, the command waited for as long as the connection lived (minutes): the guard, far above the
      // deadline, answers instead and fails the test.
      const outcome = await within(
        redis.set('k', 'during').then(
          () => 'answered',
          (err: unknown) => err,
        ),
        60_000,
        'still waiting',
      );
      expect(errorMessage(outcome)).toBe('Command timed out');
      // What the consumer runner's retry decides with: retried, not taken for a bug that stops the service.
      expect(classifyError(outcome)).toMatchObject({ code: 'REDIS_UNAVAILABLE', retriable: true });
      // The connection itself is kept: nothing to reconnect once Redis answers again.
      expect(redis.status).toBe('ready');

      r.child.kill('SIGCONT');
      await waitFor(
        async () => (await redis.ping().catch(() => null)) === 'PONG',
        'the client answers again',
      );
      // The late reply went to the command that timed out, not to the next one. A timed-out write may still
      // be applied once Redis thaws, which is why batch effects must be (and are) idempotent on retry.
      expect(await redis.get('k')).toBe('during');
      expect(await redis.set('k', 'after')).toBe('OK');
      expect(await redis.get('k')).toBe('after');
    } finally {
      r.child.kill('SIGCONT');
      redis.disconnect();
    }
  }, 120_000);

  it('while Redis is frozen the chunk in hand fails with the command timeout, and consumption pauses with the chunk held (the service does not die, nor its consumer); after the thaw every event is recorded', async () => {
    const r = await ownRedis();
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      REDIS_URL: r.url,
      REDIS_COMMAND_TIMEOUT_MS: '1000',
      // One retry: a chunk that spent its attempts would fail its batch and crash the consumer.
      PAVER_RETRY_ATTEMPTS: '1',
    });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const prefix = env.REDIS_KEY_PREFIX!;
    await createRecorderTopics(env, 1);
    const send = (from: number, n: number) => sendEvents(topic, from, n);
    await send(0, 20);
    const check = adminClient(r.port);
    const p = await startRecorder(env);
    try {
      await explained(
        p,
        waitFor(async () => (await check.scard(`${prefix}:seen`)) === 20, 'the first 20', 90_000),
      );
      r.child.kill('SIGSTOP');
      await send(20, 20);
      // Before, the chunk's first command hung for as long as the connection lived: no retry, no error.
      await explained(
        p,
        waitFor(
          () =>
            p
              .output()
              .split('\n')
              .some(
                (l) =>
                  l.includes('retrying batch chunk') &&
                  l.includes('"code":"REDIS_UNAVAILABLE"') &&
                  l.includes('Command timed out'),
              ),
          'a chunk retried after a command timeout',
          60_000,
        ),
      );
      // The timeout marks Redis unresponsive: consumption pauses and the chunk waits, its retry unspent. Before,
      // the chunk failed its batch after one retry and the consumer crashed, restart after restart.
      await explained(
        p,
        waitFor(async () => (await metric(p, 'paver_consumer_paused')) === 1, 'consumption paused', 30_000),
      );
      expect(p.child.exitCode).toBeNull();
      r.child.kill('SIGCONT');
      await explained(
        p,
        waitFor(async () => (await check.scard(`${prefix}:seen`)) === 40, 'all 40 events', 90_000),
      );
      expect(Object.keys(await deliveriesCaughtUp(env, check))).toHaveLength(40);
      expect(p.output()).not.toContain('fatal error');
      expect(p.output()).not.toContain('consumer crashed');
      expect(await metric(p, 'paver_consumer_paused')).toBe(0);
      await expectCleanStop(p);
    } finally {
      r.child.kill('SIGCONT');
      check.disconnect();
    }
  }, 240_000);

  it('/readyz is 503 with a reason while the Redis server of REDIS_URL is a read-only replica (REPLICAOF), 200 again once it is a primary', async () => {
    const { a, b, adminA: admin, stop } = await redisPair();
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), REDIS_URL: a.url });
    const prefix = env.REDIS_KEY_PREFIX!;
    await createRecorderTopics(env, 1);
    await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 10);
    const p = await startRecorder(env);
    type Readyz = { checks: Record<string, boolean>; reasons?: Record<string, string> };
    try {
      await untilReady(p, 'ready', 90_000);
      await waitFor(async () => (await admin.scard(`${prefix}:seen`)) === 10, 'the first 10');

      // What a failover can leave behind: the address the service was given now leads to a replica, which
      // answers PING (and every read) but refuses every write with READONLY.
      await admin.call('REPLICAOF', '127.0.0.1', String(b.port));
      // Before, the PING probe passed and /readyz stayed 200.
      const down = (await untilNotReady(p, '/readyz 503 while Redis is a replica', 30_000)).body as Readyz;
      expect(down.checks.redis).toBe(false);
      expect(down.reasons?.redis).toMatch(/read-only replica/);
      // The reason names the setting, never the address (REDIS_URL may carry a password).
      expect(down.reasons?.redis).not.toContain(String(a.port));
      expect(p.child.exitCode).toBeNull();

      await admin.call('REPLICAOF', 'NO', 'ONE');
      await untilReady(p, 'ready again', 30_000);
      await expectCleanStop(p);
    } finally {
      await stop();
    }
  }, 240_000);

  it('while the Redis server of REDIS_URL is a replica, consumption pauses and the chunk in hand waits (the service stays up, its retries unspent); promoted, it goes on and nothing is lost', async () => {
    const pair = await redisPair();
    const { b, adminA, stop } = pair;
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      REDIS_URL: pair.a.url,
      PAVER_RETRY_ATTEMPTS: '2',
    });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const prefix = env.REDIS_KEY_PREFIX!;
    try {
      const p = await recorderWithReplica(pair, env, 10);
      // A manual failover half done: A demoted to a replica of B, nobody promoted back yet, REDIS_URL on A.
      await adminA.call('REPLICAOF', '127.0.0.1', String(b.port));
      await waitFor(async () => /master_link_status:up/.test(await adminA.info('replication')), 'A syncing');
      await sendEvents(topic, 10, 30);
      // Before, nothing paused (the runner looked at the connection only): the chunk spent its two retries on
      // READONLY, then the consumer its restarts, until the process exited.
      // The chunk held, not only a batch paused at its start (REPLICAOF may drop the connection for a moment, and
      // a batch met then pauses before the chunk in hand is held): wait for both.
      await explained(
        p,
        waitFor(
          async () =>
            p.output().includes('retrying batch chunk once its dependency is ready') &&
            (await metric(p, 'paver_consumer_paused')) === 1,
          'consumption paused, the chunk held',
          30_000,
        ),
      );
      expect(p.output()).toContain('retrying batch chunk once its dependency is ready');
      const held = await untilNotReady(p, '/readyz 503 while paused on a replica', 30_000);
      expect(held.status).toBe(503);
      expect(p.child.exitCode).toBeNull();
      expect(await adminA.scard(`${prefix}:seen`)).toBe(10);

      // Promoted (B, the other primary, holds the same first 10 and nothing of the rest).
      await adminA.call('REPLICAOF', 'NO', 'ONE');
      await explained(
        p,
        waitFor(async () => (await adminA.scard(`${prefix}:seen`)) === 40, 'all 40 on A', 90_000),
      );
      expect(Object.keys(await deliveriesCaughtUp(env, adminA))).toHaveLength(40);
      expect(await metric(p, 'paver_consumer_paused')).toBe(0);
      expect(p.output()).not.toContain('fatal error');
      await untilReady(p, 'ready again', 30_000);
      await expectCleanStop(p);
    } finally {
      await stop();
    }
  }, 240_000);

  it('a failover behind the same address (a DNS name moved to the promoted replica): the connection to the demoted primary is made again on READONLY, and nothing is lost', async () => {
    const pair = await redisPair();
    const { a, b, adminA, adminB, stop } = pair;
    // What a managed Redis's primary endpoint does at a failover, as a TCP hop: new connections go to the
    // current primary, open ones stay where they were.
    let target = a.port;
    const sockets = new Set<Socket>();
    const proxy = createServer((client) => {
      const up = connect(target, '127.0.0.1');
      for (const s of [client, up]) {
        sockets.add(s);
        s.on('error', () => undefined);
        s.on('close', () => {
          sockets.delete(s);
          client.destroy();
          up.destroy();
        });
      }
      client.pipe(up);
      up.pipe(client);
    });
    const proxyPort = await freePort();
    await new Promise<void>((resolve) => proxy.listen(proxyPort, '127.0.0.1', resolve));
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), REDIS_URL: `redis://127.0.0.1:${proxyPort}` });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const prefix = env.REDIS_KEY_PREFIX!;
    try {
      const p = await recorderWithReplica(pair, env, 20);
      // The failover: B promoted, A demoted to its replica, the address now leading to B.
      await adminB.call('REPLICAOF', 'NO', 'ONE');
      target = b.port;
      await adminA.call('REPLICAOF', '127.0.0.1', String(b.port));
      await sendEvents(topic, 20, 20);
      // Before, the service's connection stayed on A: every batch failed with READONLY until its consumer gave up.
      await explained(
        p,
        waitFor(async () => (await adminB.scard(`${prefix}:seen`)) === 40, 'all 40 on B', 90_000),
      );
      expect(Object.keys(await deliveriesCaughtUp(env, adminB))).toHaveLength(40);
      expect(p.output()).not.toContain('fatal error');
      await untilReady(p, 'ready on B', 30_000);
      await expectCleanStop(p);
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => proxy.close(resolve));
      await stop();
    }
  }, 240_000);

  it('the readiness role query works under an ACL that refuses ROLE (INFO replication instead), or ROLE and INFO (PING: role unknown, ready as before)', async () => {
    const r = await ownRedis();
    const admin = adminClient(r.port);
    const clients: Redis[] = [];
    const roleAs = async (user: string) => {
      const env = parseEnv(commonEnvSchema, {
        KAFKA_BROKERS: stack().brokers,
        REDIS_URL: `redis://${user}:pw@127.0.0.1:${r.port}`,
      });
      const redis = createRedis(env, silentLogger());
      clients.push(redis);
      await redis.connect();
      return createRoleProbe(redis, silentLogger());
    };
    try {
      await admin.call('ACL', 'SETUSER', 'norole', 'on', '>pw', '~*', '&*', '+@all', '-role');
      await admin.call('ACL', 'SETUSER', 'noinfo', 'on', '>pw', '~*', '&*', '+@all', '-role', '-info');
      const [full, noRole, noInfo] = [
        await roleAs('default'),
        await roleAs('norole'),
        await roleAs('noinfo'),
      ];
      expect([await full(), await noRole(), await noInfo()]).toEqual(['primary', 'primary', 'unknown']);
      // A replica of a primary that does not even answer is a replica all the same: writes fail.
      await admin.call('REPLICAOF', '127.0.0.1', String(await freePort()));
      expect([await full(), await noRole(), await noInfo()]).toEqual(['replica', 'replica', 'unknown']);
      await admin.call('REPLICAOF', 'NO', 'ONE');
      expect([await full(), await noRole()]).toEqual(['primary', 'primary']);
    } finally {
      for (const c of clients) c.disconnect();
      admin.disconnect();
    }
  }, 60_000);

  it('/readyz answers (503) while Redis hangs, and the service goes on without loss once it is back', async () => {
    const r = await ownRedis();
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), REDIS_URL: r.url });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    await createRecorderTopics(env);
    const check = adminClient(r.port);
    const prefix = env.REDIS_KEY_PREFIX!;
    const send = (from: number, n: number) => sendEvents(topic, from, n);
    await send(0, 50);
    const p = await startRecorder(env);
    try {
      await untilReady(p, 'ready', 90_000);
      await waitFor(async () => (await check.scard(`${prefix}:seen`)) === 50, 'the first 50');

      // Redis stops answering without closing its connections (a frozen server, a network partition).
      r.child.kill('SIGSTOP');
      await send(50, 50);
      // A probe needs an answer, not a hang: not ready, within a bounded time.
      const down = await untilNotReady(p, '/readyz 503 while Redis hangs', 30_000);
      type Readyz = { checks: Record<string, boolean>; reasons?: Record<string, string> };
      expect((down.body as Readyz).checks.redis).toBe(false);
      // Why, too: a probe that got no answer in time, or a batch's command past REDIS_COMMAND_TIMEOUT_MS.
      expect((down.body as Readyz).reasons?.redis).toMatch(
        /^(no answer within \d+ ms|Redis does not answer within REDIS_COMMAND_TIMEOUT_MS)/,
      );
      expect((await probe(p.url('/healthz'), 2_000))?.status).toBe(200);

      r.child.kill('SIGCONT');
      await untilReady(p, 'ready again', 60_000);
      await waitFor(async () => (await check.scard(`${prefix}:seen`)) === 100, 'all 100 events', 60_000);
      const deliveries = await check.hgetall(`${prefix}:deliveries`);
      expect(Object.keys(deliveries)).toHaveLength(100);
      expect(p.child.exitCode).toBeNull();
      await expectCleanStop(p);
    } finally {
      r.child.kill('SIGCONT');
      check.disconnect();
    }
  }, 240_000);

  it('SIGTERM while Redis is down and a chunk is being retried: exits 0 within the retry bound, the chunk uncommitted and read again', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-ops-redis-'));
    let r = await ownRedis(undefined, dir);
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      REDIS_URL: r.url,
      FIXTURE_DELAY_MS: '2000',
      PAVER_BATCH_CHUNK: '10',
    });
    const prefix = env.REDIS_KEY_PREFIX!;
    await createRecorderTopics(env, 1);
    await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 40);
    let check = adminClient(r.port);
    try {
      const p = await startRecorder(env);
      await untilFirstChunk(p, check, env);
      const before = await check.hgetall(`${prefix}:deliveries`);
      check.disconnect();
      r.child.kill('SIGKILL');
      await waitFor(() => r.child.exitCode !== null || r.child.signalCode !== null, 'redis-server gone');
      await explained(
        p,
        waitFor(() => p.output().includes('retrying batch chunk'), 'the chunk in hand retried', 30_000),
      );
      const t0 = Date.now();
      p.child.kill('SIGTERM');
      // Bounded by one retry wait (PAVER_RETRY_MAX_MS, 5 s) plus one attempt against the dead Redis.
      expect(await explained(p, exitWithin(p, 20_000))).toBe(0);
      process.stderr.write(`[ops] exit ${Date.now() - t0} ms after SIGTERM with Redis down\n`);

      r = await ownRedis(r.port, dir);
      check = adminClient(r.port);
      expect(await check.hgetall(`${prefix}:deliveries`)).toEqual(before);
      const again = await restartUntilAll(env, check, 40);
      // What was written before the outage was committed: none of it is read again.
      expect(redelivered(before, await deliveriesCaughtUp(env, check))).toEqual([]);
      await expectCleanStop(again);
    } finally {
      check.disconnect();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);

  it('a fatal error met while a SIGTERM drains the chunk in hand exits 1, not 0, and commits nothing of that chunk', async () => {
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), PAVER_BATCH_CHUNK: '10' });
    await createRecorderTopics(env, 1);
    await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 30);
    const check = testRedis();
    const prefix = env.REDIS_KEY_PREFIX!;
    try {
      // The chunk in hand is held until the stop begins, then meets a bug before it writes anything: the
      // order is fixed however loaded the machine is.
      await check.set(`${prefix}:stall`, '0');
      const p = await startRecorder(env);
      await explained(
        p,
        waitFor(async () => (await check.exists(`${prefix}:stalling`)) === 1, 'a chunk in hand', 90_000),
      );
      await check.set(`${prefix}:bug`, '1');
      p.child.kill('SIGTERM');
      // Before, the signal's stop had already settled on 0: a supervisor saw a clean stop.
      expect(await explained(p, exitWithin(p, 30_000))).toBe(1);
      expect(p.output()).toContain('"msg":"shutting down"');
      expect(p.output()).toContain('fatal error');
      const seen = await check.scard(`${prefix}:seen`);
      await check.del(`${prefix}:bug`, `${prefix}:stall`);
      const again = await restartUntilAll(env, check, 30);
      expect(seen).toBe(0);
      await expectCleanStop(again);
    } finally {
      check.disconnect();
    }
  }, 240_000);

  /** The process's JSON log lines of `level` (pino's number: 60 fatal). */
  const logLines = (p: Proc, level: number) =>
    p
      .output()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((l) => l.level === level);

  it.each([
    ['rejection', 'unhandledRejection', 'fixture: a rejection nobody awaits'],
    ['exception', 'uncaughtException', 'fixture: a throw in a timer'],
  ])(
    'a process fault (%s) logs one structured line, stops gracefully, exits 1; the chunk in hand is read again by the next run',
    async (fault, kind, message) => {
      const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), PAVER_BATCH_CHUNK: '10' });
      await createRecorderTopics(env, 1);
      await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 30);
      const check = testRedis();
      const prefix = env.REDIS_KEY_PREFIX!;
      try {
        await check.set(`${prefix}:fault`, fault);
        const p = await startRecorder(env);
        expect(await explained(p, exitWithin(p, 60_000))).toBe(1);
        expect(await check.exists(`${prefix}:faulted`)).toBe(1);
        // Before, Node ended the process at once: a raw stack on stderr and none of these lines.
        const [line, ...more] = logLines(p, 60);
        expect(more).toEqual([]);
        expect(line).toMatchObject({
          kind,
          err: message,
          msg: expect.stringContaining('stopping gracefully'),
        });
        expect(line?.stack).toContain(message);
        expect(p.output()).not.toMatch(/Node\.js v\d+/);
        // The graceful stop ran to its end: the consumer left its group, the process its dependencies.
        expect(p.output()).toContain(`"why":"${kind}"`);
        expect(p.output()).toMatch(/"exitCode":1,.*"msg":"stopped"/);
        expect(p.output()).not.toContain('shutdown timed out');
        expect(await check.scard(`${prefix}:seen`)).toBe(0);
        await check.del(`${prefix}:fault`);
        // Nothing of the chunk in hand was committed: the next run reads and records all of it.
        const again = await restartUntilAll(env, check, 30);
        await expectCleanStop(again);
      } finally {
        check.disconnect();
      }
    },
    240_000,
  );

  it('a second process fault during the graceful stop exits 1 at once, without waiting for the stop', async () => {
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      PAVER_BATCH_CHUNK: '10',
      // The stop cannot finish (the chunk in hand ignores it): only the second fault can end it this soon.
      PAVER_SHUTDOWN_TIMEOUT_MS: '600000',
    });
    await createRecorderTopics(env, 1);
    await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 10);
    const check = testRedis();
    const prefix = env.REDIS_KEY_PREFIX!;
    try {
      await check.set(`${prefix}:fault`, 'twice');
      const p = await startRecorder(env);
      expect(await explained(p, exitWithin(p, 60_000))).toBe(1);
      // Sorted: the logger writes asynchronously, and the exit flushes the second line on the main thread while the
      // first may still be on its way (seen once on a loaded machine). Each fault has its one line all the same.
      const lines = logLines(p, 60).sort((a, b) => String(a.err).localeCompare(String(b.err)));
      expect(lines.map((l) => [l.kind, l.err])).toEqual([
        ['unhandledRejection', 'fixture: a rejection nobody awaits'],
        ['unhandledRejection', 'fixture: a second rejection, during the stop'],
      ]);
      expect(lines[0]?.msg).toContain('stopping gracefully');
      expect(lines[1]?.msg).toContain('exiting now');
      expect(p.output()).toContain('"msg":"shutting down"');
      expect(p.output()).not.toContain('"msg":"stopped"');
      expect(p.output()).not.toContain('shutdown timed out');
    } finally {
      check.disconnect();
    }
  }, 240_000);

  it('Redis unreachable at start-up, then lost mid-stream and back: /readyz says so, consumption pauses and resumes, nothing lost', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-ops-redis-'));
    const port = await freePort();
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), REDIS_URL: `redis://127.0.0.1:${port}` });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const prefix = env.REDIS_KEY_PREFIX!;
    await createRecorderTopics(env);
    const send = (from: number, n: number) => sendEvents(topic, from, n);
    await send(0, 50);
    const p = await startRecorder(env);
    let check: Redis | null = null;
    const connectCheck = () => (check = adminClient(port));
    const notReady = () =>
      waitFor(async () => {
        const res = await probe(p.url('/readyz'), 3_000);
        return res?.status === 503 && !(res.body as { checks: Record<string, boolean> }).checks.redis;
      }, '/readyz 503, redis false');
    try {
      await explained(p, notReady());
      expect((await probe(p.url('/healthz'), 2_000))?.status).toBe(200);
      let r = await ownRedis(port, dir);
      const c = connectCheck();
      await untilReady(p, 'ready', 90_000);
      await waitFor(async () => (await c.scard(`${prefix}:seen`)) === 50, 'the first 50');
      c.disconnect();

      r.child.kill('SIGKILL');
      await send(50, 50);
      await explained(p, notReady());
      r = await ownRedis(port, dir);
      const c2 = connectCheck();
      await untilReady(p, 'ready again', 90_000);
      await explained(
        p,
        waitFor(async () => (await c2.scard(`${prefix}:seen`)) === 100, 'all 100 events', 90_000),
      );
      expect(p.child.exitCode).toBeNull();
      await expectCleanStop(p);
    } finally {
      (check as Redis | null)?.disconnect();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);

  it('SIGTERM while Redis is frozen mid-chunk: the stop cannot finish the chunk, and PAVER_SHUTDOWN_TIMEOUT_MS bounds it (exit 1)', async () => {
    const r = await ownRedis();
    const env = serviceEnv({
      FIXTURE_GROUP_ID: unique('g'),
      REDIS_URL: r.url,
      FIXTURE_DELAY_MS: '1500',
      PAVER_BATCH_CHUNK: '10',
      PAVER_SHUTDOWN_TIMEOUT_MS: '4000',
    });
    await createRecorderTopics(env, 1);
    await sendEvents(env.PAVER_TOPIC_TOOL_CALLS!, 0, 40);
    const check = adminClient(r.port);
    try {
      const p = await startRecorder(env);
      await untilFirstChunk(p, check, env);
      r.child.kill('SIGSTOP');
      p.child.kill('SIGTERM');
      expect(await explained(p, exitWithin(p, 15_000))).toBe(1);
      expect(p.output()).toContain('shutdown timed out');
    } finally {
      r.child.kill('SIGCONT');
      check.disconnect();
    }
  }, 240_000);
});
