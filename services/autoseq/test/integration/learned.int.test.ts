import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { nextActionRecordV1, type NextActionRecord } from '../../../../schemas/index.js';
import { consumeUntil, groupCaughtUp, produce, testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import {
  expectSameAsPredict,
  learnedServiceEnv,
  LOW_BAR,
  predictFile,
  predictLines,
  startAutoseq,
} from './predict-compare.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

const fixture = join(import.meta.dirname, '../fixtures/tau2-airline-30.jsonl');
// A low bar so that rules reach every state on 30 tasks, and small bounds so that eviction runs several times
// (the service then reads whole scopes for some batches and only the touched contexts for others); the
// service gets the same values by environment.
const lowBar = LOW_BAR;

const start = (env: Record<string, string>) => startAutoseq(env, procs);

/** The next-action records read from `topic` once every event id of `want` has one (re-publications too). */
const recordsFor = async (topic: string, want: Set<string>): Promise<NextActionRecord[]> =>
  (
    await consumeUntil(topic, (all) => {
      const got = new Set(all.map((m) => (JSON.parse(m.value!.toString()) as { event_id: string }).event_id));
      return [...want].every((id) => got.has(id));
    })
  ).map((m) => nextActionRecordV1.parse(JSON.parse(m.value!.toString())) as NextActionRecord);

describe('autoseq learned proposals (real Kafka, real Redis)', () => {
  it('a dev file on a 1-partition topic gives the proposals `paver predict` gives, across a SIGKILL', async () => {
    const env = await learnedServiceEnv('aseq-learned', lowBar);
    const lines = readFileSync(fixture, 'utf8').trim().split('\n');
    const events = lines.map(
      (l) => JSON.parse(l) as { type: string; event_id: string; task_id: string; session_id: string },
    );
    const calls = events.filter((e) => e.type === 'tool_call');

    const predicted = await predictFile(fixture, lowBar);
    expect(predicted.filter((l) => l.proposal?.state === 'active').length).toBeGreaterThan(0);

    const msgs = lines.map((l, i) => ({ key: events[i]!.session_id, value: l }));
    const half = Math.floor(msgs.length / 2);
    let p = await start(env);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, msgs.slice(0, half));
    await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => all.length >= 20);
    p.child.kill('SIGKILL');
    await p.exited;
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, msgs.slice(half));
    p = await start(env);

    const want = new Set(calls.map((e) => e.event_id));
    const recs = await recordsFor(env.PAVER_TOPIC_NEXT_ACTIONS!, want);

    // At-least-once: a record re-published after the crash is identical to the first one.
    const byEvent = new Map<string, NextActionRecord>();
    for (const r of recs) {
      const prev = byEvent.get(r.event_id);
      if (prev) expect(r).toEqual(prev);
      byEvent.set(r.event_id, r);
    }
    // The record published after call j of a task is the proposal predict holds for call j+1.
    const compared = expectSameAsPredict(calls, byEvent, predicted);
    expect(compared).toBeGreaterThan(100);

    const rules = (await getJson(p.url('/rules?tenant_id=default&agent_id=default'))).body as {
      rules: { state: string; trials: number }[];
    };
    const active = rules.rules.filter((r) => r.state === 'active').length;
    expect(active).toBeGreaterThan(0);
    const gauge = async (q: Proc) =>
      parsePrometheus(String((await getJson(q.url('/metrics'))).body)).value('paver_autoseq_active_rules');
    await waitFor(async () => (await gauge(p)) === active, 'the active-rules gauge at the rules of /rules');
    // Restarted, with no event to read: the gauge starts from what Redis holds. Before, it read 0 until a batch
    // wrote the scope again, though the rules stood and the service acted on them.
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
    p = await start(env);
    await waitFor(async () => (await gauge(p)) === active, 'the active-rules gauge after a restart');
    const redis = testRedis();
    const key = `${env.REDIS_KEY_PREFIX}:aseq:{default|default}:rules`;
    expect(await redis.memory('USAGE', key)).toBeGreaterThan(0);
    // One field per context plus the counts, within the bound (passed by at most a quarter before eviction).
    const fields = await redis.hlen(key);
    expect(fields - 1).toBeGreaterThan(lowBar.maxContexts / 2);
    expect(fields - 1).toBeLessThanOrEqual(lowBar.maxContexts * 1.25);
    const meta = JSON.parse((await redis.hget(key, 'm'))!) as { nCtx: number };
    expect(meta.nCtx).toBe(fields - 1);
    redis.disconnect();
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('a value the user gives in a later message (stored with the task in Redis between batches) is proposed as `paver predict` proposes it, the next call proposed again after the message', async () => {
    // Tasks whose order number comes in the user's second message; each chunk sent ends right after such a
    // message, so the service reads the task (and the message) back from Redis before the calls that use it.
    const tasks: Record<string, unknown>[][] = [];
    let ts = 1;
    for (let i = 0; i < 40; i++) {
      const id = `later-${i}`;
      const base = () => ({ ts: ts++, session_id: id, task_id: id });
      const order = `#W${String(1_000_000 + i * 7919).slice(0, 7)}`;
      const user = `u${i}_${i % 7}`;
      let step = 0;
      const call = (tool: string, args: unknown, observation: unknown) => ({
        ...base(),
        type: 'tool_call',
        event_id: `${id}:${step}`,
        step: step++,
        tool,
        args,
        observation,
      });
      tasks.push([
        { ...base(), type: 'user_message', event_id: `${id}:u`, text: 'Hi, I need help with an order.' },
        call('get_policy', { topic: 'returns' }, { text: `policy ${i}` }),
        {
          ...base(),
          type: 'user_message',
          event_id: `${id}:u1`,
          text: `Sure: ${user}@example.com, order ${order}.`,
        },
        call('find_user_by_email', { email: `${user}@example.com` }, user),
        call('get_order', { order_id: order }, { status: i % 2 ? 'delivered' : 'pending' }),
        { ...base(), type: 'task_completed', event_id: `${id}:end` },
      ]);
    }
    // Two tasks at a time, as sessions overlap; a chunk ends after each task's second message.
    const chunks: Record<string, unknown>[][] = [];
    for (let i = 0; i < tasks.length; i += 2) {
      const [a, b] = [tasks[i]!, tasks[i + 1]!];
      chunks.push([a[0]!, b[0]!, a[1]!, b[1]!, a[2]!, b[2]!], [a[3]!, b[3]!, a[4]!, b[4]!, a[5]!, b[5]!]);
    }
    const events = chunks.flat();
    const predicted = await predictLines(
      events.map((e) => JSON.stringify(e)),
      lowBar,
    );
    // The email's and the order number's only source is the second message: predict proposes both, active, for
    // most tasks (the lookup from the proposal made again once the message came).
    for (const tool of ['find_user_by_email', 'get_order']) {
      const active = predicted.filter((l) => l.proposal?.state === 'active' && l.proposal.tool === tool);
      expect(active.length, tool).toBeGreaterThan(20);
    }

    const env = await learnedServiceEnv('aseq-later', lowBar);
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const p = await start(env);
    for (const chunk of chunks) {
      await produce(
        topic,
        chunk.map((e) => ({ key: e.session_id as string, value: JSON.stringify(e) })),
      );
      await waitFor(() => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, topic), 'chunk read');
    }
    const calls = events.filter((e) => e.type === 'tool_call') as { event_id: string; task_id: string }[];
    const want = new Set(calls.map((e) => e.event_id));
    const recs = await recordsFor(env.PAVER_TOPIC_NEXT_ACTIONS!, want);
    const byEvent = new Map(recs.map((r) => [r.event_id, r]));
    expect(
      expectSameAsPredict(
        events as { type: string; event_id: string; task_id: string }[],
        byEvent,
        predicted,
      ),
    ).toBe(80);
    // Records after the second messages: the lookup proposed with the email the answer gave.
    const afterMessage = recs.filter((r) => r.event_id.endsWith(':u1'));
    expect(
      afterMessage.filter((r) => r.tool === 'find_user_by_email' && r.rule_state === 'active').length,
    ).toBeGreaterThan(10);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
});
