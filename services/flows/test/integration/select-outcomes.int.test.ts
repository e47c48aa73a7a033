import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { groupCaughtUp, produce, testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { FLOWS, stream } from './account-stream.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  redis.disconnect();
});

/**
 * POST /flows/select ranks with the scope's past outcomes as the service's own selections do, on an instance that
 * has read none of the scope's sessions: here a process started after the stream was consumed (a restart; an
 * instance whose partitions hold none of the scope's sessions is the same case). Before, the outcome memory was
 * read from Redis only by event batches, and this process answered as if no run had ever been seen.
 */
describe('flows service: selection on demand with past outcomes', () => {
  it('a new process answers POST /flows/select with the outcomes in Redis, as the process that recorded them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-select-outcomes-'));
    const flowsFile = join(dir, 'flows.json');
    writeFileSync(flowsFile, JSON.stringify(FLOWS));
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-so-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-so-${Date.now()}`,
      FLOWS_FILE: flowsFile,
    });
    await createFlowsTopics(env, 1);
    const select = async (p: Proc) => {
      const res = await fetch(p.url('/flows/select'), {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ query: 'please help with my account' }),
      });
      expect(res.status).toBe(200);
      return ((await res.json()) as { chosen: { name: string }[] }).chosen.map((c) => c.name);
    };

    const first = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(first);
    await waitFor(() => isReady(first), 'flows /readyz');
    // Before any run, the words favour the review flow.
    const cold = await select(first);
    const { lines } = stream();
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      lines.map((l) => ({ key: (JSON.parse(l) as { session_id: string }).session_id, value: l })),
    );
    await waitFor(() => groupCaughtUp(env.FLOWS_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!), 'stream consumed');
    await waitFor(async () => {
      const [key] = await redis.keys(`${env.REDIS_KEY_PREFIX!}:flows:*:outcomes`);
      return key !== undefined && (await redis.llen(key)) >= 14;
    }, 'runs recorded');
    const warm = await select(first);
    // Not vacuous: the recorded runs moved the choice.
    expect(warm).not.toEqual(cold);
    first.child.kill('SIGTERM');
    expect(await first.exited).toBe(0);

    // Nothing new on the topic: this process reads no session of the scope.
    const second = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(second);
    await waitFor(() => isReady(second), 'flows /readyz (second process)');
    expect(await select(second)).toEqual(warm);

    // Scopes a client makes up, with no flow: nothing to rank, so their runs are not read (one LRANGE each, and a
    // mark kept for the life of the process, before).
    const monitor = await redis.duplicate().monitor();
    const reads: string[] = [];
    const end = `${env.REDIS_KEY_PREFIX!}:monitor-end`;
    let monitorSaw = false;
    monitor.on('monitor', (_t: string, args: string[]) => {
      if (args[0]?.toLowerCase() === 'lrange' && args[1]?.includes(':flows:{made-up-')) reads.push(args[1]);
      if (args[0]?.toLowerCase() === 'get' && args[1] === end) monitorSaw = true;
    });
    try {
      for (let i = 0; i < 20; i++) {
        const res = await fetch(second.url('/flows/select'), {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ query: 'please help with my account', tenant_id: `made-up-${i}` }),
        });
        expect(res.status).toBe(200);
        expect(((await res.json()) as { chosen: unknown[] }).chosen).toEqual([]);
      }
      // The scope with flows is read as before (its runs are already in memory: nothing more to read for it).
      expect(await select(second)).toEqual(warm);
      // MONITOR's feed lags the replies: a last command of our own, seen, says every earlier one was.
      await redis.get(end);
      await waitFor(() => monitorSaw, 'the monitor to see the last command');
    } finally {
      monitor.disconnect();
    }
    expect(reads).toEqual([]);
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
  });
});
