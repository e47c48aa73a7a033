import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { nextActionRecordV1, type NextActionRecord } from '../../../../schemas/index.js';
import { consumeUntil, produce, testRedis } from '../../../../test/helpers/kafka.js';
import { getJson, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import type { PredictLine } from '../../src/core/learn/engine.js';
import { replay } from '../../src/learn-cli.js';
import { expectSameAsPredict, learnedServiceEnv, LOW_BAR, startAutoseq } from './predict-compare.js';

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

describe('autoseq learned proposals (real Kafka, real Redis)', () => {
  it('a dev file on a 1-partition topic gives the proposals `paver predict` gives, across a SIGKILL', async () => {
    const env = await learnedServiceEnv('aseq-learned', lowBar);
    const lines = readFileSync(fixture, 'utf8').trim().split('\n');
    const events = lines.map(
      (l) => JSON.parse(l) as { type: string; event_id: string; task_id: string; session_id: string },
    );
    const calls = events.filter((e) => e.type === 'tool_call');

    const predicted: PredictLine[] = [];
    await replay(
      fixture,
      lowBar,
      null,
      (l) => predicted.push(l),
      () => undefined,
    );
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
    const recs = (
      await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => {
        const got = new Set(
          all.map((m) => (JSON.parse(m.value!.toString()) as { event_id: string }).event_id),
        );
        return [...want].every((id) => got.has(id));
      })
    ).map((m) => nextActionRecordV1.parse(JSON.parse(m.value!.toString())) as NextActionRecord);

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
    expect(rules.rules.some((r) => r.state === 'active')).toBe(true);
    const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    expect(m.value('paver_autoseq_active_rules')).toBeGreaterThan(0);
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
});
