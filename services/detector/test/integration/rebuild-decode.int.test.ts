import { afterAll, describe, expect, it } from 'vitest';
import { createTopics, produce, testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  redis.disconnect();
});

async function flushPrefix(prefix: string): Promise<number> {
  const n = await redis.eval(
    "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do n = n + redis.call('DEL', k) end return n",
    0,
    `${prefix}:*`,
  );
  return Number(n);
}

const metricOf = (p: Proc) => async (name: string, labels?: Record<string, string>) =>
  parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name, labels);

/** An event of session s0 as a record. */
const ev = (o: Record<string, unknown>) => ({ key: 's0', value: JSON.stringify({ session_id: 's0', ...o }) });

/** Empties the detector's Redis, makes it notice with a later event, and waits for the rebuild that follows. */
async function loseRedisAndRebuild(env: Record<string, string | undefined>, p: Proc, now: number) {
  expect(await flushPrefix(env.REDIS_KEY_PREFIX!)).toBeGreaterThan(0);
  await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
    ev({ type: 'tool_call', event_id: 'x-0', ts: now, task_id: 'x', step: 0, tool: 'q' }),
  ]);
  await waitFor(
    async () => (await metricOf(p)('paver_detector_rebuilds_total', { outcome: 'rebuilt' })) >= 2,
    'rebuild',
    60_000,
  ).catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output().slice(-2000)}`);
  });
}

/**
 * Live, a tool_call whose args nest deeper than LIMITS.jsonDepth is dead-lettered (shared/kafka/decode.ts:
 * deeperThan, and the PAVER_MAX_MESSAGE_BYTES precheck). The rebuild's replay (main.ts `replay`) decoded with
 * codec.decode + parse only, without those checks, so after a Redis loss the same event was applied: the rebuilt
 * records hold a tool the lost ones never had, and the candidates change.
 */
describe('a rebuild after a Redis loss decodes as the live path does (real Kafka and Redis)', () => {
  it('leaves out what the live path dead-lettered (too deep), so the candidates are those before the loss', async () => {
    const env = serviceEnv({});
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    let deep: unknown = { leaf: 1 };
    for (let i = 0; i < 300; i++) deep = { n: deep };
    const now = Date.now();
    const events: { key: string; value: string }[] = [];
    for (let t = 0; t < 3; t++) {
      const ts = now - 60_000 + t * 1_000;
      ['a', 'b', 'c'].forEach((tool, i) =>
        events.push(
          ev({ type: 'tool_call', event_id: `t${t}-${i}`, ts: ts + i, task_id: `t${t}`, step: i, tool }),
        ),
      );
      events.push(
        ev({
          type: 'tool_call',
          event_id: `t${t}-z`,
          ts: ts + 3,
          task_id: `t${t}`,
          step: 3,
          tool: 'z',
          args: { deep },
        }),
      );
      events.push(ev({ type: 'task_completed', event_id: `t${t}-done`, ts: ts + 4, task_id: `t${t}` }));
    }
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, events);
    const p = await startProcess(['bin/paver.js', 'run', 'detector'], env);
    procs.push(p);
    const metric = metricOf(p);
    const deadLetters = async () =>
      String((await getJson(p.url('/metrics'))).body)
        .split('\n')
        .filter((l) => l.startsWith('paver_dead_letters_total'))
        .reduce((n, l) => n + Number(l.split(' ').pop()), 0);
    // Dead letters are written after their batch's work: wait for both, not one then the other.
    await waitFor(
      async () =>
        (await isReady(p)) &&
        (await metric('paver_detector_records_completed_total')) >= 3 &&
        (await deadLetters()) >= 3,
      'records and dead letters',
      60_000,
    );
    expect(await deadLetters()).toBe(3);
    const before = (await getJson(p.url('/candidates?tenant_id=default&agent_id=default'))).body as {
      tool_sequence: string[];
    }[];
    expect(before.map((c) => c.tool_sequence.join(','))).toEqual(['a,b,c']);

    await loseRedisAndRebuild(env, p, now);
    const after = (await getJson(p.url('/candidates?tenant_id=default&agent_id=default'))).body as {
      tool_sequence: string[];
    }[];
    expect(after.map((c) => c.tool_sequence.join(','))).toEqual(['a,b,c']);
  }, 180_000);
});

/**
 * The live path applies PAVER_BATCH_CHUNK messages per script call, which is what REDIS_COMMAND_TIMEOUT_MS is set
 * to outlast; the rebuild's replay must not apply a whole fetched batch in one call instead.
 */
describe('a rebuild after a Redis loss applies PAVER_BATCH_CHUNK messages per script call (real Kafka and Redis)', () => {
  it('no rebuild-mode apply call holds more ops than the chunk, and the candidates come back', async () => {
    const env = serviceEnv({ PAVER_BATCH_CHUNK: '5' });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const now = Date.now();
    const events: { key: string; value: string }[] = [];
    for (let t = 0; t < 12; t++) {
      const ts = now - 60_000 + t * 1_000;
      ['a', 'b', 'c', 'd'].forEach((tool, i) =>
        events.push(
          ev({ type: 'tool_call', event_id: `t${t}-${i}`, ts: ts + i, task_id: `t${t}`, step: i, tool }),
        ),
      );
      events.push(ev({ type: 'task_completed', event_id: `t${t}-done`, ts: ts + 9, task_id: `t${t}` }));
    }
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, events);
    const p = await startProcess(['bin/paver.js', 'run', 'detector'], env);
    procs.push(p);
    const metric = metricOf(p);
    await waitFor(
      async () => (await isReady(p)) && (await metric('paver_detector_records_completed_total')) >= 12,
      'records',
      60_000,
    );
    const candidates = async () =>
      (
        (await getJson(p.url('/candidates?tenant_id=default&agent_id=default'))).body as {
          tool_sequence: string[];
        }[]
      ).map((c) => c.tool_sequence.join(','));
    expect(await candidates()).toEqual(['a,b,c,d']);

    // Every apply call in rebuild mode, by its op count (ops are packed 9 fields to a call's one argument).
    const monitor = await testRedis().monitor();
    const rebuildCalls: number[] = [];
    monitor.on('monitor', (_time: string, args: string[]) => {
      const cmd = String(args[0]).toLowerCase();
      if ((cmd === 'evalsha' || cmd === 'eval') && args[2] === '11' && args[16] === 'r') {
        // MONITOR shows the separator escaped.
        const packed = String(args[17]);
        rebuildCalls.push((packed.split('\\x1f').length + packed.split('\u001f').length - 2) / 9);
      }
    });
    try {
      await loseRedisAndRebuild(env, p, now);
    } finally {
      monitor.disconnect();
    }
    // The 60 events replayed, 5 at a time (a first call in rebuild mode clears what a lost batch wrote: no ops).
    expect(rebuildCalls.reduce((a, b) => a + b, 0)).toBe(60);
    expect(Math.max(...rebuildCalls)).toBeLessThanOrEqual(5);
    expect(await candidates()).toEqual(['a,b,c,d']);
  }, 180_000);
});
