import { spawn, type ChildProcess } from 'node:child_process';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../../../deploy/local/stack.js';
import { createTopics, groupCaughtUp, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { serviceEnv, type Proc } from '../../../../test/helpers/process.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { withRequests } from '../reference/requests.js';
import { PARAMS, startDetector } from './backlog.js';

/**
 * A Redis failover seen from a client still connected to the old primary: once demoted it answers writes with
 * READONLY until the client finds the new primary (or the old one is promoted back). That is "not now", like
 * LOADING: the detector retries its batch. Before, its pipelines took READONLY for a script bug and the
 * process stopped (exit 1) on every failover.
 */
const events = withRequests([...agentEvents({ tasks: 200, seed: 5 })]);
const procs: Proc[] = [];
let server: ChildProcess | null = null;
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  server?.kill('SIGKILL');
});

describe('detector: a Redis failover (READONLY replies) is waited out, not fatal', () => {
  it('retries while its Redis is a read-only replica and goes on once it is a primary again', async () => {
    const port = await freePort();
    server = spawn('redis-server', ['--port', String(port), '--save', '', '--appendonly', 'no'], {
      stdio: 'ignore',
    });
    const admin = new Redis(port, '127.0.0.1', { maxRetriesPerRequest: 2 });
    admin.on('error', () => undefined);
    try {
      await waitFor(async () => (await admin.ping().catch(() => null)) === 'PONG', 'redis-server');
      const env = serviceEnv({
        ...PARAMS,
        REDIS_URL: `redis://127.0.0.1:${port}`,
        PAVER_RETRY_MAX_MS: '500',
      });
      await createTopics([
        { topic: env.PAVER_TOPIC_TOOL_CALLS! },
        { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
        { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      ]);
      const half = Math.floor(events.length / 2);
      const send = (es: typeof events) =>
        produce(
          env.PAVER_TOPIC_TOOL_CALLS!,
          es.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
        );
      await send(events.slice(0, half));
      const p = await startDetector(env, procs);
      const caughtUp = () => groupCaughtUp(env.DETECTOR_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!);
      await waitFor(caughtUp, 'the first half read');

      // Demoted: a replica of a primary that is not there (its data stays; writes answer READONLY).
      const dead = await freePort();
      await admin.call('REPLICAOF', '127.0.0.1', String(dead));
      await send(events.slice(half));
      await waitFor(() => /READONLY/.test(p.output()), 'a batch meeting READONLY', 60_000).catch(
        (err: Error) => {
          throw new Error(`${err.message}\n${p.output().slice(-4000)}`);
        },
      );
      expect(p.child.exitCode).toBeNull();

      await admin.call('REPLICAOF', 'NO', 'ONE');
      await waitFor(caughtUp, 'every event read', 90_000).catch((err: Error) => {
        throw new Error(`${err.message}\n${p.output().slice(-4000)}`);
      });
      expect(p.child.exitCode).toBeNull();
      expect(p.output()).not.toContain('fatal error');
    } finally {
      admin.disconnect();
    }
  }, 240_000);
});
