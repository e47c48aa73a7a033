import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { nextActionRecordV1, type NextActionRecord } from '../../../../schemas/index.js';
import { consumeUntil, produce, testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import type { PredictLine } from '../../src/core/learn/engine.js';
import { DEFAULT_LEARN } from '../../src/core/learn/learner.js';
import { replay } from '../../src/learn-cli.js';
import { expectSameAsPredict, learnedServiceEnv } from './predict-compare.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
});

const fixture = join(import.meta.dirname, '../fixtures/tau2-airline-30.jsonl');
const lowBar = { ...DEFAULT_LEARN, minTrials: 5, minPrecision: 0.5, targetPrecision: 0.5 };

type Ev = { type: string; event_id: string; task_id: string; session_id: string };

async function predict(lines: string[]): Promise<PredictLine[]> {
  const file = join(mkdtempSync(join(tmpdir(), 'paver-aseq-loss-')), 'events.jsonl');
  writeFileSync(file, lines.join('\n') + '\n');
  const out: PredictLine[] = [];
  await replay(
    file,
    lowBar,
    null,
    (l) => out.push(l),
    () => undefined,
  );
  return out;
}

describe('autoseq: Redis state lost mid-stream', () => {
  it('notices the loss (readyz false then true, a metric), and learns again as from a fresh start', async () => {
    const env = await learnedServiceEnv('aseq-loss', lowBar);
    const lines = readFileSync(fixture, 'utf8').trim().split('\n');
    const events = lines.map((l) => JSON.parse(l) as Ev);
    // Split at a task boundary: the tasks after the loss begin after it.
    const tasks = [...new Set(events.map((e) => e.task_id))];
    const firstAfter = events.findIndex((e) => e.task_id === tasks[15]);
    const [before, after] = [lines.slice(0, firstAfter), lines.slice(firstAfter)];
    const callsOf = (ls: string[]) =>
      ls.map((l) => JSON.parse(l) as Ev).filter((e) => e.type === 'tool_call');
    const send = (ls: string[]) =>
      produce(
        env.PAVER_TOPIC_TOOL_CALLS!,
        ls.map((l) => ({ key: (JSON.parse(l) as Ev).session_id, value: l })),
      );
    const records = async (want: Set<string>) =>
      (
        await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => {
          const got = new Set(all.map((m) => (JSON.parse(m.value!.toString()) as Ev).event_id));
          return [...want].every((id) => got.has(id));
        })
      ).map((m) => nextActionRecordV1.parse(JSON.parse(m.value!.toString())) as NextActionRecord);

    const p = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'autoseq /readyz');
    await send(before);
    await records(new Set(callsOf(before).map((e) => e.event_id)));
    const rulesUrl = p.url('/rules?tenant_id=default&agent_id=default');
    const rulesBefore = (await getJson(rulesUrl)).body as { rules: unknown[] };
    expect(rulesBefore.rules.length).toBeGreaterThan(0);

    await redis.flushall();
    await waitFor(async () => !(await isReady(p)), '/readyz false once the state is gone');
    await waitFor(() => isReady(p), '/readyz true again');
    const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
    expect(m.value('paver_autoseq_state_losses_total')).toBe(1);
    expect(((await getJson(rulesUrl)).body as { rules: unknown[] }).rules).toEqual([]);

    // After the loss the service answers as a fresh one would over the later events alone: `paver predict`
    // over them gives the same proposals (rules, states and arguments).
    await send(after);
    const afterCalls = callsOf(after);
    const recs = await records(new Set(afterCalls.map((e) => e.event_id)));
    const byEvent = new Map(recs.map((r) => [r.event_id, r]));
    const compared = expectSameAsPredict(afterCalls, byEvent, await predict(after));
    expect(compared).toBeGreaterThan(40);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
});
