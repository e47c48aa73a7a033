import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { groupCaughtUp, produce, testRedis, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { refKey } from '../../src/adapters/engine.js';
import { RedisFlowStore } from '../../src/adapters/redis/store.js';
import { FLOWS, stream } from './account-stream.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
});

type Line = { type: string; session_id: string; tool?: string };

describe('flows: open sessions outlive the process that followed them', () => {
  it('SIGKILLed in the middle of sessions, the service still records every run as the stream has it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-sessions-'));
    const flowsFile = join(dir, 'flows.json');
    writeFileSync(flowsFile, JSON.stringify(FLOWS));
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-${Date.now()}`,
      FLOWS_FILE: flowsFile,
    });
    await createFlowsTopics(env, 1);
    const { lines } = stream();
    const parsed = lines.map((l) => JSON.parse(l) as Line);
    // What the stream holds: each session's tools, in the order sessions end.
    const expected = [...new Set(parsed.map((l) => l.session_id))].map((s) =>
      parsed.filter((l) => l.session_id === s && l.type === 'tool_call').map((l) => l.tool),
    );
    // Cut in the middle of a session (its request and two calls before, the rest after), and again later.
    const cuts = [
      parsed.findIndex((l) => l.session_id === 'run-4') + 3,
      parsed.findIndex((l) => l.session_id === 'run-9') + 2,
    ];
    const parts = [lines.slice(0, cuts[0]), lines.slice(cuts[0], cuts[1]), lines.slice(cuts[1])];
    const send = (part: string[]) =>
      produce(
        env.PAVER_TOPIC_TOOL_CALLS!,
        part.map((l) => ({ key: (JSON.parse(l) as Line).session_id, value: l })),
      );

    for (const [i, part] of parts.entries()) {
      const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
      procs.push(p);
      await waitFor(() => isReady(p), 'flows /readyz');
      await send(part);
      await waitFor(() => groupCaughtUp(env.FLOWS_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!), 'part consumed');
      if (i < parts.length - 1) {
        p.child.kill('SIGKILL');
        await p.exited;
      }
    }

    const key = `${env.REDIS_KEY_PREFIX}:flows:{default|default}:outcomes`;
    const runs = (await redis.lrange(key, 0, -1)).map((v) => (JSON.parse(v) as { calls: string[] }).calls);
    expect(runs).toEqual(expected);
    // Every session ended: none is left open (each ended one is remembered, for a redelivery, an hour at most).
    const left = await redis.keys(`${env.REDIS_KEY_PREFIX}:flows:*:session:*`);
    expect(left).toHaveLength(expected.length);
    for (const k of left) {
      expect(JSON.parse((await redis.get(k))!)).toMatchObject({ ended: true });
      expect(await redis.pttl(k)).toBeLessThanOrEqual(3_600_000);
    }
  });

  it("an expelled instance's late save does not put an older state back", async () => {
    const prefix = unique('sess');
    const store = new RedisFlowStore(redis, prefix);
    const ref = { tenant: 'acme', agent: 'a1', session: 's1' };
    const state = (calls: string[], at: string) => ({
      tenant: 'acme',
      agent: 'a1',
      terms: ['close'],
      calls,
      shadow: null,
      at,
    });
    const read = async () => (await store.loadSessions([ref])).get(refKey(ref));
    // The partition's next owner saved further along; the expelled one saves its older state afterwards.
    await store.saveSessions([{ ref, s: state(['a', 'b', 'c'], '0:12') }], [], 60_000);
    await store.saveSessions([{ ref, s: state(['a', 'b'], '0:9') }], [], 60_000);
    expect(await read()).toMatchObject({ calls: ['a', 'b', 'c'], at: '0:12' });
    // Further along (one more digit too: offsets compare as numbers), or its end, does replace it.
    await store.saveSessions([{ ref, s: state(['a', 'b', 'c', 'd'], '0:100') }], [], 60_000);
    expect(await read()).toMatchObject({ at: '0:100' });
    await store.saveSessions([], [{ ref, at: '0:101' }], 60_000);
    expect(await read()).toEqual({ ended: true, at: '0:101' });
    await store.saveSessions([{ ref, s: state(['a'], '0:99') }], [], 60_000);
    expect(await read()).toEqual({ ended: true, at: '0:101' });
    // Arguments, outputs and the request's text (input_map evidence) are not written: a session is written again
    // after every batch, and the evidence runs live in memory anyway.
    await store.saveSessions(
      [
        {
          ref,
          s: {
            ...state(['a', 'b', 'c', 'd', 'e'], '0:102'),
            userText: 'close my account',
            evidence: [{ tool: 'a', args: { id: 1 }, observation: 'x'.repeat(10_000) }],
          },
        },
      ],
      [],
      60_000,
    );
    const stored = (await redis.get(`${prefix}:flows:{acme|a1}:session:s1`))!;
    expect(JSON.parse(stored)).toEqual(state(['a', 'b', 'c', 'd', 'e'], '0:102'));
    // Another partition (the topic was recreated or grew): the newer write wins.
    await store.saveSessions([{ ref, s: state(['x'], '3:5') }], [], 60_000);
    expect(await read()).toMatchObject({ calls: ['x'], at: '3:5' });
  });
});
