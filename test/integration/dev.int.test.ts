import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../deploy/local/stack.js';
import { waitFor } from '../helpers/kafka.js';
import { alive, PAVER_BIN, serviceEnv, startProcess, type Proc } from '../helpers/process.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

/** Preloaded into the services of a test: on SIGTERM, a service's main thread blocks for good. */
const HANG_ON_SIGTERM = fileURLToPath(new URL('../fixtures/hang-on-sigterm.mjs', import.meta.url));

const ready = async (port: number) => {
  try {
    return (await fetch(`http://127.0.0.1:${port}/readyz`)).status === 200;
  } catch {
    return false;
  }
};
/** The pid `paver dev` printed for the latest start of a service. */
const pidOf = (out: string, name: string): number | null => {
  const all = [...out.matchAll(new RegExp(`paver dev: ${name} starting \\(pid (\\d+)\\)`, 'g'))];
  const last = all[all.length - 1];
  return last ? Number(last[1]) : null;
};

describe('paver dev supervises its services (real Kafka, real Redis, real processes)', () => {
  it('restarts a service that dies, keeps the others running, and stops cleanly on SIGTERM', async () => {
    const [detectorPort, autoseqPort] = [await freePort(), await freePort()];
    const env = serviceEnv({
      PAVER_DETECTOR_HTTP_PORT: String(detectorPort),
      PAVER_AUTOSEQ_HTTP_PORT: String(autoseqPort),
    });
    env.PAVER_TOPIC_TOOL_CATALOG = `${env.PAVER_TOPIC_TOOL_CALLS}.catalog`;
    env.AUTOSEQ_GROUP_ID = `${env.DETECTOR_GROUP_ID}-autoseq`;
    const dev = await startProcess([PAVER_BIN, 'dev', '--service', 'detector', '--service', 'autoseq'], env);
    procs.push(dev);
    const explain = (err: Error) => {
      throw new Error(`${err.message}\n${dev.output().slice(-5000)}`);
    };
    await waitFor(
      async () => (await ready(detectorPort)) && (await ready(autoseqPort)),
      'both ready',
      120_000,
    ).catch(explain);
    const detector = pidOf(dev.output(), 'detector')!;
    const autoseq = pidOf(dev.output(), 'autoseq')!;
    expect(detector).toBeGreaterThan(0);

    process.kill(detector, 'SIGKILL');
    await waitFor(
      () => (pidOf(dev.output(), 'detector') ?? detector) !== detector,
      'detector restarted with a new pid',
      60_000,
    ).catch(explain);
    expect(dev.output()).toMatch(/detector exited \(SIGKILL\); restarting in \d+ ms/);
    await waitFor(() => ready(detectorPort), 'restarted detector ready', 120_000).catch(explain);
    // The other service was never touched: same process, still ready, and dev itself is still running.
    expect(pidOf(dev.output(), 'autoseq')).toBe(autoseq);
    expect(await ready(autoseqPort)).toBe(true);
    expect(dev.child.exitCode).toBeNull();

    dev.child.kill('SIGTERM');
    expect(await dev.exited).toBe(0);
    expect(dev.output()).toContain('paver dev: stopped');
  });

  it('killed outright, it leaves no service running: each stops gracefully once its parent is gone', async () => {
    const port = await freePort();
    const dev = await startProcess(
      [PAVER_BIN, 'dev', '--service', 'detector'],
      serviceEnv({ PAVER_DETECTOR_HTTP_PORT: String(port) }),
    );
    procs.push(dev);
    const explain = (err: Error) => {
      throw new Error(`${err.message}\n${dev.output().slice(-5000)}`);
    };
    await waitFor(() => ready(port), 'detector ready', 120_000).catch(explain);
    const detector = pidOf(dev.output(), 'detector')!;
    dev.child.kill('SIGKILL');
    await dev.exited;
    // Its stdout and stderr were the dead parent's pipes: the stop is seen by its pid going, and its port closing.
    try {
      await waitFor(() => !alive(detector), 'the orphaned detector to stop', 60_000);
    } finally {
      if (alive(detector)) process.kill(detector, 'SIGKILL');
    }
    expect(await ready(port)).toBe(false);
  });

  it('SIGKILLs a service still running past its shutdown timeout and a margin, instead of waiting for it for ever', async () => {
    const port = await freePort();
    const dev = await startProcess(
      [PAVER_BIN, 'dev', '--service', 'detector'],
      serviceEnv({
        PAVER_DETECTOR_HTTP_PORT: String(port),
        PAVER_SHUTDOWN_TIMEOUT_MS: '1000',
        NODE_OPTIONS: `--import=${HANG_ON_SIGTERM}`,
      }),
    );
    procs.push(dev);
    const explain = (err: Error) => {
      throw new Error(`${err.message}\n${dev.output().slice(-5000)}`);
    };
    await waitFor(() => ready(port), 'detector ready', 120_000).catch(explain);
    const detector = pidOf(dev.output(), 'detector')!;
    try {
      dev.child.kill('SIGTERM');
      // Before: dev waited for the hung service's exit for ever, and never stopped its stack.
      await waitFor(() => dev.child.exitCode !== null, 'paver dev to stop', 60_000).catch(explain);
      expect(await dev.exited).toBe(0);
      expect(dev.output()).toMatch(/detector \(pid \d+\) still running \d+ ms after SIGTERM: SIGKILL/);
      expect(dev.output()).toContain('paver dev: stopped');
      expect(alive(detector)).toBe(false);
    } finally {
      if (alive(detector)) process.kill(detector, 'SIGKILL');
    }
  });

  it('never prints the password of an external REDIS_URL', async () => {
    const env = serviceEnv({ PAVER_DETECTOR_HTTP_PORT: String(await freePort()) });
    const url = new URL(env.REDIS_URL!);
    url.username = 'paver';
    url.password = 'hunter2-secret';
    env.REDIS_URL = url.toString();
    const dev = await startProcess([PAVER_BIN, 'dev', '--service', 'detector'], env);
    procs.push(dev);
    // Before, its start-up line printed REDIS_URL as given, password and all.
    await waitFor(() => dev.output().includes('detector starting'), 'detector launched', 60_000);
    dev.child.kill('SIGTERM');
    await dev.exited;
    expect(dev.output()).toContain('stack ready');
    expect(dev.output()).toContain(`REDIS_URL=redis://paver:***@${url.host}`);
    expect(dev.output()).not.toContain('hunter2');
  });

  it('exits 78 once every service it runs refused its configuration, instead of idling on the stack', async () => {
    const dev = await startProcess(
      [PAVER_BIN, 'dev', '--service', 'detector', '--service', 'sequencer'],
      serviceEnv({
        LOG_LEVEL: 'loud',
        PAVER_DETECTOR_HTTP_PORT: String(await freePort()),
        PAVER_SEQUENCER_HTTP_PORT: String(await freePort()),
      }),
    );
    procs.push(dev);
    // Before: both said 'not restarting it (the others keep running)', and dev went on with no service at all
    // until a Ctrl-C, which then exited 0.
    const code = await Promise.race([
      dev.exited,
      waitFor(() => false, 'paver dev to exit on its own', 60_000).catch((err: Error) => {
        throw new Error(`${err.message}\n${dev.output().slice(-3000)}`);
      }),
    ]);
    expect(code).toBe(78);
    expect(dev.output()).toContain('no service left running');
  });
});
