import { afterAll, describe, expect, it } from 'vitest';
import { registryCodec } from '../../shared/codec.js';
import { consumeUntil, createTopics, groupCaughtUp, produce, unique, waitFor } from '../helpers/kafka.js';
import { explained, getJson, killAll, serviceEnv, startReady, type Proc } from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';
import { startRegistryDouble } from '../helpers/registry-double.js';

const procs: Proc[] = [];
const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  await killAll(procs);
  for (const c of cleanups) await c().catch(() => undefined);
});

const event = (i: number, session: string) => ({
  type: 'tool_call',
  event_id: `e${i}`,
  ts: 1_700_000_000_000 + i,
  session_id: session,
  task_id: `t-${session}`,
  step: i,
  tool: 'search',
  // What the agent was shown: the sequencer, with no orchestration for it, publishes a record only when it knows that.
  visible_tools: ['search'],
});
const metrics = async (p: Proc) => parsePrometheus(String((await getJson(p.url('/metrics'))).body));
async function readyz(p: Proc): Promise<{ status: number; reasons: Record<string, string> }> {
  const r = await getJson(p.url('/readyz'));
  return { status: r.status, reasons: (r.body as { reasons?: Record<string, string> }).reasons ?? {} };
}

/**
 * A registry double (closed after the file) and a sequencer's environment using it, `env` added. A small retry
 * budget and restart limit: a service that spends them on the outage exits within seconds.
 */
async function registryAndEnv(env: Record<string, string>) {
  const reg = await startRegistryDouble();
  cleanups.push(() => reg.close());
  return {
    reg,
    env: serviceEnv({
      SCHEMA_REGISTRY_URL: reg.url,
      PAVER_RETRY_ATTEMPTS: '2',
      PAVER_RETRY_INITIAL_MS: '50',
      PAVER_RETRY_MAX_MS: '200',
      PAVER_MAX_CONSUMER_RESTARTS: '1',
      ...env,
    }),
  };
}

const startSequencer = (env: Record<string, string>) =>
  startReady(['bin/paver.js', 'run', 'sequencer'], env, procs, 90_000);

/*
 * Before, a registry down for maintenance failed every framed input and every output: the chunk spent its
 * retries, the consumer its restarts, and the process exited, again at every start while the outage lasted.
 */
describe('a schema registry outage (real Kafka and Redis, a real sequencer, the registry double)', () => {
  it('pauses consumption with /readyz naming the registry, and processes every event once it is back', async () => {
    const { reg, env } = await registryAndEnv({ SEQUENCER_GROUP_ID: unique('seq-registry') });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    await createTopics([{ topic, partitions: 2 }]);
    const p = await startSequencer(env);

    // Framed by a producer that registered the schema while the registry was up; the service has not seen it.
    const producer = registryCodec({ url: reg.url });
    const framed = await Promise.all(
      Array.from({ length: 10 }, (_, i) => producer.encode('tool-calls.v1', topic, event(i, `a${i % 3}`))),
    );
    const unknownId = Buffer.concat([
      Buffer.from([0, 0, 0, 3, 231]),
      Buffer.from(JSON.stringify(event(99, 'a0'))),
    ]);
    reg.setDown(true);
    // Partition 0: framed input, whose decode needs the registry (and one whose schema id it does not know).
    // Partition 1: plain JSON input, which decodes without it, but whose output's encode needs it.
    await produce(topic, [
      ...framed.map((value, i) => ({ key: `a${i % 3}`, value, partition: 0 })),
      { key: 'a0', value: unknownId, partition: 0 },
      ...Array.from({ length: 10 }, (_, i) => ({
        key: `b${i % 3}`,
        value: JSON.stringify(event(10 + i, `b${i % 3}`)),
        partition: 1,
      })),
    ]);

    const paused = async () => {
      expect(p.child.exitCode, p.output().slice(-3000)).toBeNull();
      const r = await readyz(p);
      const m = await metrics(p);
      return r.status === 503 &&
        /schema registry/.test(r.reasons.schema_registry ?? '') &&
        m.value('paver_consumer_paused') === 1 &&
        m.value('paver_dead_letters_total') === 0
        ? m
        : null;
    };
    await explained(p, waitFor(paused, '/readyz 503 naming the registry, consumption paused', 90_000));
    // Waiting, not giving up: many more refused registry calls than the retry budget and restarts allow, and the
    // process paused and alive at each look.
    const refused = reg.refused();
    await explained(
      p,
      waitFor(
        async () => (await paused()) !== null && reg.refused() >= refused + 10,
        'the service to keep waiting on the registry',
        90_000,
      ),
    );

    reg.setDown(false);
    await explained(
      p,
      waitFor(
        async () =>
          (await groupCaughtUp(env.SEQUENCER_GROUP_ID!, topic)) &&
          (await readyz(p)).status === 200 &&
          (await metrics(p)).value('paver_consumer_paused') === 0,
        'every event processed, /readyz 200 again',
        120_000,
      ),
    );
    const m = await metrics(p);
    expect(m.value('paver_events_consumed_total', { topic, outcome: 'processed' })).toBe(20);
    expect(m.value('paver_consumer_crashes_total')).toBe(0);
    // One output per event, each once, framed by the registry.
    const out = await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) => all.length >= 20);
    const ids = await Promise.all(
      out.map(async (r) => ((await producer.decode(r.value!)) as { event_id: string }).event_id),
    );
    expect(ids.sort()).toEqual(Array.from({ length: 20 }, (_, i) => `e${i}`).sort());
    // Only the record whose schema id the registry does not know is dead-lettered, as before.
    const dead = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 1);
    expect(dead).toHaveLength(1);
    expect(JSON.parse(dead[0]!.value!.toString())).toMatchObject({
      reason: 'registry_error',
      source: { topic, partition: 0, offset: '10' },
    });
    expect(p.child.exitCode).toBeNull();
  }, 360_000);

  it('pauses a configuration table too: a framed record read during the outage is applied once it is back', async () => {
    const { reg, env } = await registryAndEnv({
      SEQUENCER_GROUP_ID: unique('seq-registry-table'),
      PAVER_TOPIC_ORCHESTRATION: unique('orch-registry'),
    });
    const orchestration = env.PAVER_TOPIC_ORCHESTRATION!;
    await createTopics([{ topic: env.PAVER_TOPIC_TOOL_CALLS! }, { topic: orchestration, compacted: true }]);
    const p = await startSequencer(env);
    const producer = registryCodec({ url: reg.url });
    const config = {
      schema_version: 1,
      tools: ['a', 'b'],
      steps: [{ name: 'ab', isDefault: true, availableTools: { allowed: ['a', 'b'] }, sequence: ['a', 'b'] }],
    };
    const framed = await producer.encode('orchestration.v1', orchestration, config);
    reg.setDown(true);
    await produce(orchestration, [{ key: 'default/default', value: framed }]);
    const applied = async () =>
      (await metrics(p)).value('paver_sequencer_config_updates_total', { outcome: 'applied' });
    // Waiting, not giving up: many more refused registry calls than the table's retries and restarts allow.
    const refused = reg.refused();
    await explained(
      p,
      waitFor(
        async () => {
          expect(p.child.exitCode, p.output().slice(-3000)).toBeNull();
          return (
            reg.refused() >= refused + 10 &&
            /schema registry/.test((await readyz(p)).reasons.schema_registry ?? '')
          );
        },
        'the table to keep waiting on the registry',
        90_000,
      ),
    );
    expect(await applied()).toBe(0);
    reg.setDown(false);
    await explained(
      p,
      waitFor(
        async () => (await applied()) === 1 && (await readyz(p)).status === 200,
        'the record applied',
        120_000,
      ),
    );
    const m = await metrics(p);
    expect(m.value('paver_consumer_crashes_total')).toBe(0);
    expect(m.value('paver_dead_letters_total')).toBe(0);
    expect(p.child.exitCode).toBeNull();
  }, 360_000);
});
