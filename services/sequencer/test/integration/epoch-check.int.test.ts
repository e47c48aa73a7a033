import { createServer, connect as tcpConnect, type Server, type Socket } from 'node:net';
import { Redis, type RedisOptions } from 'ioredis';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { testRedis, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../../../../test/helpers/own-redis.js';
import { createLogger } from '../../../../shared/log.js';
import { createEpoch } from '../../../../shared/redis/epoch.js';
import { cheapEpochCheck, trackedEpochCheck, type TrackedEpoch } from '../../src/adapters/epoch.js';

let redis: Redis;
beforeAll(() => {
  redis = testRedis();
});
afterAll(() => redis.disconnect());

/** Calls of one command the server has answered. */
async function calls(command: string): Promise<number> {
  const m = new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(await redis.info('commandstats'));
  return Number(m?.[1] ?? 0);
}

describe('cheap epoch check (real Redis)', () => {
  it('an unchanged marker costs one GET; a marker removed or replaced is a loss, every time', async () => {
    const key = `${unique('epoch')}:seq:epoch`;
    const epoch = cheapEpochCheck(redis, createEpoch(redis, key));
    expect((await epoch.check()).lost).toBe(true); // first check of a process: no marker yet
    const seen = epoch.current();

    const [sets, execs] = [await calls('set'), await calls('exec')];
    for (let i = 0; i < 5; i++) expect(await epoch.check()).toEqual({ lost: false, epoch: seen });
    expect([await calls('set'), await calls('exec')]).toEqual([sets, execs]);

    await redis.del(key); // FLUSHALL, or a restart without persistence
    expect((await epoch.check()).lost).toBe(true);
    expect(epoch.current()).not.toBe(seen);
    expect((await epoch.check()).lost).toBe(false);

    await redis.set(key, 'recreated-by-another-instance');
    expect((await epoch.check()).lost).toBe(true);
    expect(epoch.current()).toBe('recreated-by-another-instance');
    expect((await epoch.check()).lost).toBe(false);
  });
});

describe('tracked epoch check (real redis-server of its own)', () => {
  const log = createLogger('sequencer-test', 'silent');
  const conns: Redis[] = [];
  const closers: (() => void)[] = [];
  afterAll(() => {
    for (const c of closers) c();
    for (const c of conns) c.disconnect();
    stopOwnRedis();
  });
  const connect = (url: string, o: RedisOptions = {}) => {
    const c = new Redis(url, { commandTimeout: 500, maxRetriesPerRequest: 0, ...o });
    c.on('error', () => undefined);
    conns.push(c);
    return c;
  };
  // A long heartbeat where only invalidations are under test: a busy machine's pauses must not end tracking.
  const tracked = (conn: Redis, key: string, heartbeatMs = 30_000) => {
    const e = trackedEpochCheck(conn, createEpoch(conn, key), { heartbeatMs, log });
    closers.push(() => e.close());
    return e;
  };
  const gets = async (admin: Redis) =>
    Number(/cmdstat_get:calls=(\d+)/.exec(await admin.info('commandstats'))?.[1] ?? 0);
  /** Checks (each finding nothing lost) until tracking is set up again: a check that finds nothing lost sets it up. */
  const untilTracking = (e: TrackedEpoch) =>
    waitFor(async () => !(await e.check()).lost && e.tracking(), 'tracking set up');

  it('while tracking, checks cost no GET; a FLUSHALL, a deleted marker and a replaced one are each a loss', async () => {
    const r = await ownRedis();
    const admin = connect(r.url);
    const e = tracked(connect(r.url), 'trk:seq:epoch');
    expect((await e.check()).lost).toBe(true);
    await untilTracking(e);
    const seen = e.current();
    const before = await gets(admin);
    for (let i = 0; i < 50; i++) expect(await e.check()).toEqual({ lost: false, epoch: seen });
    expect(await gets(admin)).toBe(before);

    await admin.flushall();
    await waitFor(() => !e.tracking(), 'the FLUSHALL invalidation');
    expect((await e.check()).lost).toBe(true);
    await untilTracking(e);

    await admin.del('trk:seq:epoch');
    await waitFor(() => !e.tracking(), 'the DEL invalidation');
    expect((await e.check()).lost).toBe(true);
    await untilTracking(e);

    await admin.set('trk:seq:epoch', 'another-instance');
    await waitFor(() => !e.tracking(), 'the SET invalidation');
    expect(await e.check()).toEqual({ lost: true, epoch: 'another-instance' });
    await untilTracking(e);
    expect(e.current()).toBe('another-instance');
  });

  it('a killed tracking connection, a server restarted empty and a frozen one each end tracking; the GET then decides', async () => {
    const r = await ownRedis();
    const admin = connect(r.url, { maxRetriesPerRequest: 1 });
    const e = tracked(connect(r.url), 'trk2:seq:epoch');
    await e.check();
    await untilTracking(e);

    // The invalidations' connection killed: its redirect would go nowhere, and tracking ends.
    await admin.client('KILL', 'TYPE', 'pubsub');
    await waitFor(() => !e.tracking(), 'tracking ended with its connection');
    expect((await e.check()).lost).toBe(false);
    await untilTracking(e);

    // A restart without persistence: nothing invalidates anything, the connections close.
    r.child.kill('SIGKILL');
    await waitFor(() => !e.tracking(), 'tracking ended with the server');
    await ownRedis(r.port);
    await waitFor(async () => (await e.check().catch(() => null))?.lost === true, 'the loss seen');
    await untilTracking(e);

    // Frozen: the connections stay open and nothing is invalidated; the heartbeat stops vouching.
    const frozen = await ownRedis();
    const f = tracked(connect(frozen.url), 'trk3:seq:epoch', 200);
    await f.check();
    await untilTracking(f);
    frozen.child.kill('SIGSTOP');
    try {
      await waitFor(() => !f.tracking(), 'tracking ended with the heartbeat');
      await expect(f.check()).rejects.toThrow();
    } finally {
      frozen.child.kill('SIGCONT');
    }
    await waitFor(async () => (await f.check().catch(() => null))?.lost === false, 'the server back');
  });

  it('an invalidations connection the server dropped while the client heard nothing ends tracking: a loss after it is seen', async () => {
    const r = await ownRedis();
    const admin = connect(r.url);
    // A middlebox (a NAT or load balancer that forgot an idle connection): what the server closes stays open
    // on the client's side, silent. The invalidations' connection carries nothing while the marker holds.
    const sockets: Socket[] = [];
    const proxy: Server = createServer((down) => {
      const up = tcpConnect(r.port, '127.0.0.1');
      sockets.push(down, up);
      let upGone = false;
      const gone = () => (upGone = true);
      up.on('error', gone).on('close', gone);
      down.on('error', () => undefined).on('close', () => up.destroy());
      down.on('data', (d: Buffer) => {
        if (!upGone) up.write(d);
      });
      up.on('data', (d: Buffer) => down.write(d));
    });
    await new Promise<void>((ok) => proxy.listen(0, '127.0.0.1', ok));
    closers.push(() => {
      for (const s of sockets) s.destroy();
      proxy.close();
    });
    const port = (proxy.address() as { port: number }).port;
    const e = tracked(connect(`redis://127.0.0.1:${port}`), 'trk5:seq:epoch', 200);
    await e.check();
    await untilTracking(e);

    await admin.client('KILL', 'TYPE', 'pubsub');
    // The redirect now goes to a client that is gone: Redis drops the marker's invalidation without a word.
    await waitFor(() => !e.tracking(), 'tracking ended: the invalidations connection no longer answers');
    await admin.del('trk5:seq:epoch');
    await waitFor(async () => (await e.check().catch(() => null))?.lost === true, 'the loss seen');
  });

  it('a wall clock set back does not stretch the heartbeat: a frozen server ends tracking all the same', async () => {
    const frozen = await ownRedis();
    // A deadline far longer than the wait below: only the heartbeat may end tracking here.
    const f = tracked(connect(frozen.url, { commandTimeout: 120_000 }), 'trk6:seq:epoch', 200);
    await f.check();
    await untilTracking(f);
    // In the same turn as the check that found tracking on (no answer is read meanwhile): frozen, and the wall
    // clock set back an hour (an NTP step, a VM resumed), going on from there.
    frozen.child.kill('SIGSTOP');
    vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
    try {
      vi.setSystemTime(Date.now() - 3_600_000);
      await waitFor(() => !f.tracking(), 'tracking ended with the heartbeat', 30_000);
    } finally {
      vi.useRealTimers();
      frozen.child.kill('SIGCONT');
    }
  });

  it('a server that keeps failing the set-up (maxclients reached): one warning, attempts spaced out, then tracking again', async () => {
    const r = await ownRedis();
    const admin = connect(r.url);
    const conn = connect(r.url);
    const lines: string[] = [];
    const capture = pino({ level: 'info' }, { write: (l: string) => void lines.push(l) });
    const e = trackedEpochCheck(conn, createEpoch(conn, 'trk6:seq:epoch'), {
      heartbeatMs: 30_000,
      log: capture,
    });
    closers.push(() => e.close());
    expect((await e.check()).lost).toBe(true);
    const stat = async (name: string) =>
      Number(new RegExp(`${name}:(\\d+)`).exec(await admin.info())?.[1] ?? 0);
    // No connection more: every attempt's two connections are refused.
    await admin.config('SET', 'maxclients', String(await stat('connected_clients')));
    const rejected0 = await stat('rejected_connections');
    const t0 = performance.now();
    // Reads go on (a GET each) while attempts fail: at least four attempts' worth of time.
    await waitFor(async () => {
      expect((await e.check()).lost).toBe(false);
      return performance.now() - t0 > 8_000;
    }, 'eight seconds of failed set-ups');
    const attempts = ((await stat('rejected_connections')) - rejected0) / 2;
    const seconds = (performance.now() - t0) / 1000;
    expect(attempts).toBeGreaterThanOrEqual(2);
    // Waits of 1, 2, 4… s: within s seconds at most 1 + log2(s + 1) attempts (a second apart, it was 1 + s).
    expect(attempts).toBeLessThanOrEqual(1 + Math.log2(seconds + 1) + 1);
    expect(e.tracking()).toBe(false);
    const warned = () => lines.filter((l) => l.includes('could not be set up'));
    expect(warned()).toHaveLength(1);
    expect((JSON.parse(warned()[0]!) as { level: number; err: string }).level).toBe(40);

    await admin.config('SET', 'maxclients', '10000');
    await waitFor(async () => !(await e.check()).lost && e.tracking(), 'tracking set up again', 90_000);
    expect(lines.some((l) => l.includes('set up again'))).toBe(true);
    expect(warned()).toHaveLength(1);
  }, 120_000);

  it('a Redis user not allowed tracking: every check is a GET, as without tracking', async () => {
    const r = await ownRedis();
    const admin = connect(r.url);
    await admin.acl('SETUSER', 'reader', 'on', '>pw', '~*', '+@all', '-client', 'resetchannels');
    const url = r.url.replace('redis://', 'redis://reader:pw@');
    const e = tracked(connect(url), 'trk4:seq:epoch');
    expect((await e.check()).lost).toBe(true);
    const before = await gets(admin);
    for (let i = 0; i < 20; i++) expect((await e.check()).lost).toBe(false);
    expect(e.tracking()).toBe(false);
    expect(await gets(admin)).toBe(before + 20);
  });
});
