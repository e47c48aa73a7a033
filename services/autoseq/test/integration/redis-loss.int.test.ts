import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { nextActionRecordV1, type NextActionRecord } from '../../../../schemas/index.js';
import {
  consumeUntil,
  createTopics,
  groupCaughtUp,
  produce,
  produceOnePerBatch,
  testRedis,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../../../../test/helpers/own-redis.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { getJson, isReady, startProcess, type Proc, stopPromptly } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import type { PredictLine } from '../../src/core/learn/engine.js';
import { DEFAULT_LEARN } from '../../src/core/learn/learner.js';
import {
  expectSameAsPredict,
  learnedServiceEnv,
  policyRecord,
  predictLines,
  toolRecord,
} from './predict-compare.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
  stopOwnRedis();
});

const fixture = join(import.meta.dirname, '../fixtures/tau2-airline-30.jsonl');
const lowBar = { ...DEFAULT_LEARN, minTrials: 5, minPrecision: 0.5, targetPrecision: 0.5 };

type Ev = { type: string; event_id: string; task_id: string; session_id: string };

const predict = (lines: string[]): Promise<PredictLine[]> => predictLines(lines, lowBar);

const metric = async (p: Proc, name: string, labels?: Record<string, string>) =>
  parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name, labels) ?? 0;

const callsOf = (ls: string[]) => ls.map((l) => JSON.parse(l) as Ev).filter((e) => e.type === 'tool_call');

/** Publishing the fixture's lines and reading the service's records, on `env`'s topics. */
const io = (env: Record<string, string>) => ({
  callsOf,
  send: (ls: string[]) =>
    produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      ls.map((l) => ({ key: (JSON.parse(l) as Ev).session_id, value: l })),
    ),
  records: async (want: Set<string>) =>
    (
      await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => {
        const got = new Set(all.map((m) => (JSON.parse(m.value!.toString()) as Ev).event_id));
        return [...want].every((id) => got.has(id));
      })
    ).map((m) => nextActionRecordV1.parse(JSON.parse(m.value!.toString())) as NextActionRecord),
});

describe('autoseq: Redis state lost mid-stream', () => {
  it('notices the loss (readyz false then true, a metric), restores the rules from the rules topic, and answers as if nothing was lost', async () => {
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-loss', lowBar)),
      AUTOSEQ_RULES_SNAPSHOT_MS: '200',
    };
    const lines = readFileSync(fixture, 'utf8').trim().split('\n');
    const events = lines.map((l) => JSON.parse(l) as Ev);
    // Split at a task boundary: the tasks after the loss begin after it (task states are not restored).
    const tasks = [...new Set(events.map((e) => e.task_id))];
    const firstAfter = events.findIndex((e) => e.task_id === tasks[15]);
    const [before, after] = [lines.slice(0, firstAfter), lines.slice(firstAfter)];
    const { callsOf, send, records } = io(env);

    const p = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'autoseq /readyz');
    await send(before);
    await records(new Set(callsOf(before).map((e) => e.event_id)));
    // Every batch saved (committed after its save), then every change it made copied to the rules topic.
    await waitFor(
      () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'the events before the loss committed',
    );
    await waitFor(
      async () =>
        (await metric(p, 'paver_autoseq_rules_snapshot_pending')) === 0 &&
        (await metric(p, 'paver_autoseq_rules_snapshot_records_total', { kind: 'context' })) > 0,
      'the learned state copied to the rules topic',
    );
    const rulesUrl = p.url('/rules?tenant_id=default&agent_id=default');
    const rulesBefore = (await getJson(rulesUrl)).body as { rules: { trials: number }[] };
    expect(rulesBefore.rules.length).toBeGreaterThan(3);

    await redis.flushall();
    await waitFor(async () => !(await isReady(p)), '/readyz false once the state is gone');
    await waitFor(() => isReady(p), '/readyz true again');
    expect(await metric(p, 'paver_autoseq_state_losses_total')).toBe(1);
    expect(await metric(p, 'paver_autoseq_rules_restored_contexts_total')).toBeGreaterThan(0);
    // The rules as they were: same states, trials, hits, bounds and bindings.
    expect((await getJson(rulesUrl)).body).toEqual(rulesBefore);

    // Lost again, and read at once, before a batch or a probe has noticed: the read waits for the restore, as
    // batches do. Before, it answered from the empty Redis (200, no rule), and during a restore with whatever
    // scopes it had written so far.
    await redis.flushall();
    const read = await getJson(rulesUrl);
    expect(read.status).toBe(200);
    expect(read.body).toEqual(rulesBefore);
    expect(await metric(p, 'paver_autoseq_state_losses_total')).toBe(2);

    // And the service goes on as if nothing was lost: `paver predict` over the whole stream gives the same
    // proposals (rules, states and arguments) for every call, those after the loss included.
    await send(after);
    const allCalls = callsOf(lines);
    const recs = await records(new Set(allCalls.map((e) => e.event_id)));
    const byEvent = new Map(recs.map((r) => [r.event_id, r]));
    const predicted = await predict(lines);
    const afterCompared = expectSameAsPredict(
      callsOf(after),
      byEvent,
      predicted.slice(callsOf(before).length),
    );
    expect(afterCompared).toBeGreaterThan(40);
    expect(expectSameAsPredict(allCalls, byEvent, predicted)).toBeGreaterThan(afterCompared);
    // What the rules proven before the loss still earn after it: a fresh start (the state lost for good)
    // would have made fewer active proposals over the same events.
    const active = (ls: PredictLine[]) => ls.filter((l) => l.proposal?.state === 'active').length;
    const afterActive = active(predicted.slice(callsOf(before).length));
    expect(afterActive).toBeGreaterThan(active(await predict(after)));
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('a Redis emptied while the service was down: the last copy (made by the graceful stop) comes back at the next start', async () => {
    // No copy by interval within the test: only the one a graceful stop makes.
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-down', lowBar)),
      AUTOSEQ_RULES_SNAPSHOT_MS: '3600000',
    };
    const { send, records } = io(env);
    const lines = readFileSync(fixture, 'utf8').trim().split('\n');
    const p1 = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
    procs.push(p1);
    await waitFor(() => isReady(p1), 'autoseq /readyz');
    await send(lines);
    await records(new Set(callsOf(lines).map((e) => e.event_id)));
    await waitFor(
      () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'every event committed',
    );
    const rulesBefore = (await getJson(p1.url('/rules?tenant_id=default&agent_id=default'))).body as {
      rules: { state: string }[];
    };
    expect(rulesBefore.rules.some((r) => r.state === 'active')).toBe(true);
    expect(await metric(p1, 'paver_autoseq_rules_snapshot_records_total')).toBe(0);
    p1.child.kill('SIGTERM');
    expect(await p1.exited).toBe(0);

    await redis.flushall();
    const p2 = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
    procs.push(p2);
    await waitFor(() => isReady(p2), 'autoseq /readyz after the restore');
    expect(await metric(p2, 'paver_autoseq_rules_restored_contexts_total')).toBeGreaterThan(0);
    expect((await getJson(p2.url('/rules?tenant_id=default&agent_id=default'))).body).toEqual(rulesBefore);
    p2.child.kill('SIGTERM');
    expect(await p2.exited).toBe(0);
  });

  it('an auto-executed run whose task state was lost counts as at its limit: nothing more executes until the agent calls again', async () => {
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-guard', DEFAULT_LEARN)),
      AUTOSEQ_MAX_CONSECUTIVE: '3',
    };
    // A chain of tools: t<i> takes {k<i>} and its output is {k<i+1>}, so each output decides the next tool.
    const chain = [0, 1, 2, 3].map((i) =>
      toolRecord(`t${i}`, {
        type: 'object',
        properties: { [`k${i}`]: { type: 'integer' } },
        required: [`k${i}`],
      }),
    );
    await produce(env.PAVER_TOPIC_TOOL_CATALOG!, [policyRecord(), ...chain]);
    let step = 0;
    const ev = (tool: string, out: string, origin: 'llm' | 'auto_seq') => {
      step += 1;
      const value = {
        type: 'tool_call',
        event_id: `guard-${step}`,
        ts: Date.now(),
        session_id: 'sg',
        task_id: 'tg',
        step,
        tool,
        origin,
        observation: { [out]: step },
      };
      return { id: value.event_id, msg: { key: 'sg', value: JSON.stringify(value) } };
    };
    const decision = async (id: string) => {
      const recs = await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) =>
        all.some((m) => (JSON.parse(m.value!.toString()) as Ev).event_id === id),
      );
      return recs
        .map((m) => nextActionRecordV1.parse(JSON.parse(m.value!.toString())) as NextActionRecord)
        .filter((r) => r.event_id === id && r.event_type !== 'auto_seq_executed')
        .at(-1);
    };
    const p = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'autoseq /readyz');
    await waitFor(async () => (await metric(p, 'paver_autoseq_catalog_tools')) === 4, 'the catalog loaded');
    // The agent's call, then one auto-executed step: the run is at 1 of 3.
    const first = ev('plan', 'k0', 'llm');
    const second = ev('t0', 'k1', 'auto_seq');
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [first.msg, second.msg]);
    expect(await decision(first.id)).toMatchObject({ tool: 't0', execute: true });
    expect(await decision(second.id)).toMatchObject({ tool: 't1', execute: true });
    await waitFor(
      () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'the run so far committed',
    );

    // The task state goes with Redis: how many steps ran automatically is no longer known.
    await redis.flushall();
    const third = ev('t1', 'k2', 'auto_seq');
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [third.msg]);
    expect(await decision(third.id)).toMatchObject({
      event_type: 'auto_seq_skipped',
      reason: 'loop_guard',
      tool: 't2',
    });
    expect(await metric(p, 'paver_autoseq_state_losses_total')).toBe(1);
    // The agent's own next call ends the run, and execution resumes.
    const fourth = ev('look', 'k2', 'llm');
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [fourth.msg]);
    expect(await decision(fourth.id)).toMatchObject({ tool: 't2', execute: true });
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('honours a SIGTERM during a long restore: exits 0 at once, the restore stays owed, and the next start brings every rule back', async () => {
    // Before, the restore ran on under the stop, the batch waiting for it was then handled and committed by a
    // process told to stop, and a restore longer than PAVER_SHUTDOWN_TIMEOUT_MS ended in exit 1.
    const own = await ownRedis();
    const env: Record<string, string> = {
      ...(await learnedServiceEnv('aseq-stop', lowBar)),
      REDIS_URL: own.url,
      AUTOSEQ_RULES_SNAPSHOT_MS: '200',
      // One small record batch per fetch: reading the rules topic takes many fetches, and a while.
      KAFKA_MAX_BYTES_PER_PARTITION: '1024',
      PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
    };
    const rulesTopic = env.AUTOSEQ_RULES_TOPIC!;
    await createTopics([{ topic: rulesTopic, partitions: 1, compacted: true }]);
    // Another deployment's copies (another key prefix: read, then skipped) ahead of this one's on the topic,
    // each record alone in a fetch (over KAFKA_MAX_BYTES_PER_PARTITION).
    const PAD = 8000;
    const filler = 'x'.repeat(1024);
    await produceOnePerBatch(rulesTopic, PAD, (i) => ({
      key: JSON.stringify(['elsewhere', 'default', 'default', `pad-${i}`]),
      value: JSON.stringify({ v: 1, value: filler }),
    }));

    const r = new Redis(own.url);
    const marker = `${env.REDIS_KEY_PREFIX}:aseq:epoch`;
    const flag = restoreFlagKey(marker);
    // A marker without its flag: a Redis that lost nothing, so the first start does not restore.
    await r.set(marker, 'before');
    const lines = readFileSync(fixture, 'utf8').trim().split('\n');
    const { send, records } = io(env);
    const start = async () => {
      const p = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
      procs.push(p);
      return p;
    };
    const first = await start();
    await waitFor(() => isReady(first), 'autoseq /readyz');
    await send(lines);
    await records(new Set(callsOf(lines).map((e) => e.event_id)));
    await waitFor(
      () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'every event committed',
    );
    await waitFor(
      async () =>
        (await metric(first, 'paver_autoseq_rules_snapshot_pending')) === 0 &&
        (await metric(first, 'paver_autoseq_rules_snapshot_records_total', { kind: 'context' })) > 0,
      'the learned state copied to the rules topic',
    );
    const rulesUrl = '/rules?tenant_id=default&agent_id=default';
    const rulesBefore = (await getJson(first.url(rulesUrl))).body as { rules: unknown[] };
    expect(rulesBefore.rules.length).toBeGreaterThan(3);

    await r.flushall();
    // A call of another tenant (the rules compared are left as they are): its batch finds the state gone and
    // waits for the restore.
    const call = JSON.parse(lines.find((l) => callsOf([l]).length > 0)!) as Ev;
    await send([JSON.stringify({ ...call, event_id: 'after-the-loss', tenant_id: 'elsewhere' })]);
    await waitFor(
      async () => (await metric(first, 'paver_autoseq_state_losses_total')) === 1,
      'the restore under way',
    );
    // Far below PAVER_SHUTDOWN_TIMEOUT_MS: the stop did not wait for its work.
    const code = await stopPromptly(first);
    expect(code, first.output().slice(-3000)).toBe(0);
    expect(first.output()).not.toContain('learned rules restored from the rules topic');
    expect(first.output()).toContain('redis state rebuild stopped by the stop');
    // The batch that waited was given back, and the restore is still owed: its flag says so.
    expect(await groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!)).toBe(false);
    expect(await r.exists(flag)).toBe(1);

    const second = await start();
    await waitFor(() => isReady(second), 'autoseq /readyz after the restore', 120_000);
    expect(second.output()).toContain('learned rules restored from the rules topic');
    expect(await metric(second, 'paver_autoseq_rules_restored_contexts_total')).toBeGreaterThan(0);
    expect(await r.exists(flag)).toBe(0);
    expect((await getJson(second.url(rulesUrl))).body).toEqual(rulesBefore);
    // The gauge counts the rules the restore brought back (before, 0 until a batch wrote the scope again).
    const active = (rulesBefore.rules as { state: string }[]).filter((x) => x.state === 'active').length;
    expect(active).toBeGreaterThan(0);
    await waitFor(
      async () => (await metric(second, 'paver_autoseq_active_rules')) === active,
      'the active-rules gauge after the restore',
    );
    await waitFor(
      () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
      'the call after the loss handled after the restart',
    );
    r.disconnect();
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
  }, 300_000);
});
