import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { sequenceStateRecordV1, type SequenceStateRecord } from '../../../../schemas/index.js';
import {
  consumeUntil,
  createTopics,
  groupCaughtUp,
  produce,
  testRedis,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import {
  getJson,
  isReady,
  ROOT,
  serviceEnv,
  startProcess,
  type Proc,
} from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { rng } from '../../../../testkit/streams.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
});

const CONFIG = join(ROOT, 'examples', 'orchestration.yaml');
const TOOLS = ['web_search', 'http_get', 'think', 'reflect', 'summarize', 'save', 'critique', 'debate'];
const MESSAGES = ['please research this', 'evaluate the answer', 'hello there'];

/** Sessions that mostly follow their sequences, with slips; `from` numbers the events on from there. */
function events(sessions: number, perSession: number, seed: number, from: number) {
  const r = rng(seed);
  const out: Record<string, unknown>[] = [];
  let ts = 1_760_000_000_000 + from * 1000;
  for (let k = from; k < from + perSession; k++)
    for (let s = 0; s < sessions; s++) {
      const base = { event_id: `s${s}-e${k}`, ts: ts++, session_id: `sess-${s}` };
      if (k % 7 === 0)
        out.push({ ...base, type: 'user_message', text: MESSAGES[Math.floor(r() * MESSAGES.length)] });
      else
        out.push({
          ...base,
          type: 'tool_call',
          task_id: `task-${s}`,
          step: k,
          tool: TOOLS[Math.floor(r() * TOOLS.length)],
        });
    }
  return out;
}

/** `paver sequence` over these events alone: what sessions that start with them are answered. */
async function offline(evs: Record<string, unknown>[]): Promise<Map<string, SequenceStateRecord[]>> {
  const file = join(mkdtempSync(join(tmpdir(), 'paver-seq-loss-')), 'events.jsonl');
  writeFileSync(file, evs.map((e) => JSON.stringify(e)).join('\n') + '\n');
  const p = await startProcess(['bin/paver.js', 'sequence', '--config', CONFIG, '--input', file], {
    PATH: process.env.PATH ?? '',
  });
  expect(await p.exited).toBe(0);
  return bySession(
    p
      .output()
      .trim()
      .split('\n')
      .map((l) => sequenceStateRecordV1.parse(JSON.parse(l))),
  );
}
function bySession(rs: SequenceStateRecord[]) {
  const m = new Map<string, SequenceStateRecord[]>();
  for (const r of rs) m.set(r.session_id, [...(m.get(r.session_id) ?? []), r]);
  return m;
}

describe('sequencer: Redis state lost mid-stream', () => {
  for (const copy of [true, false])
    it(
      copy
        ? 'notices the loss (readyz false, then true; a metric), restores every session from the session topic, and goes on as if nothing was lost'
        : 'without the session copy (SEQUENCER_STATE_COPY_ENABLED=false): notices the loss, and every session starts over as documented',
      async () => {
        const env = serviceEnv({
          SEQUENCER_GROUP_ID: `seq-${Date.now()}`,
          PAVER_TOPIC_ORCHESTRATION: `orch-${Date.now()}`,
          SEQUENCER_CONFIG_FILE: CONFIG,
          SEQUENCER_STATE_COPY_ENABLED: String(copy),
        });
        await createTopics([
          { topic: env.PAVER_TOPIC_TOOL_CALLS! },
          { topic: env.PAVER_TOPIC_SEQUENCE_STATE! },
          { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
          { topic: env.PAVER_TOPIC_ORCHESTRATION!, compacted: true },
        ]);
        const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
        procs.push(p);
        await waitFor(() => isReady(p), 'sequencer /readyz');

        const sessions = 12;
        const before = events(sessions, 10, 3, 0);
        const after = events(sessions, 12, 4, 10);
        const send = (evs: Record<string, unknown>[]) =>
          produce(
            env.PAVER_TOPIC_TOOL_CALLS!,
            evs.map((e) => ({ key: e.session_id as string, value: JSON.stringify(e) })),
          );
        // With the copy, a session's records go on as if nothing was lost (the whole stream offline); without
        // it, those after the loss are those of a session whose first event came after it.
        const [ref1, ref2, whole] = [
          await offline(before),
          await offline(after),
          await offline([...before, ...after]),
        ];
        const count = (m: Map<string, SequenceStateRecord[]>) =>
          [...m.values()].reduce((n, r) => n + r.length, 0);
        const allowed = async (session: string) => {
          const { session_id: _, ...answer } = (
            await getJson(p.url(`/sessions/${session}/allowed-tools?tools=${TOOLS.join(',')}`))
          ).body as { session_id: string };
          return answer;
        };
        const answers = () => Promise.all([...Array(sessions).keys()].map((s) => allowed(`sess-${s}`)));
        const metric = async (name: string) =>
          parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name);

        await send(before);
        await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) => all.length >= count(ref1));
        // Every batch's states written (committed after the write), so what Redis loses is all on the topic.
        await waitFor(
          () => groupCaughtUp(env.SEQUENCER_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
          'the events before the loss committed',
        );
        const fresh = await allowed('never-seen');
        const answersBefore = await answers();
        // Not vacuous: some sessions are somewhere a fresh session is not.
        expect(answersBefore.some((a) => JSON.stringify(a) !== JSON.stringify(fresh))).toBe(true);

        // Reads check the epoch with no Redis command now (tracking): the loss must be noticed all the same.
        const tracking = () =>
          waitFor(async () => (await metric('paver_sequencer_epoch_tracking')) === 1, 'epoch tracking');
        await tracking();
        await redis.flushall();
        await waitFor(async () => !(await isReady(p)), '/readyz false once the state is gone');
        await waitFor(() => isReady(p), '/readyz true again');
        expect(await metric('paver_sequencer_state_losses_total')).toBe(1);
        expect(await metric('paver_sequencer_sessions_restored_total')).toBe(copy ? sessions : 0);
        // Every session answers as before the loss (restored), or as a session that never ran (its cached
        // state forgotten with Redis).
        expect(await answers()).toEqual(copy ? answersBefore : answersBefore.map(() => fresh));

        await send(after);
        const all = await consumeUntil(
          env.PAVER_TOPIC_SEQUENCE_STATE!,
          (got) => got.length >= count(ref1) + count(ref2),
        );
        const live = bySession(all.map((m) => sequenceStateRecordV1.parse(JSON.parse(m.value!.toString()))));
        for (let s = 0; s < sessions; s++) {
          const id = `sess-${s}`;
          expect(live.get(id), id).toEqual(
            copy ? whole.get(id) : [...(ref1.get(id) ?? []), ...(ref2.get(id) ?? [])],
          );
        }
        await waitFor(
          () => groupCaughtUp(env.SEQUENCER_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
          'the events after the loss committed',
        );
        const answersAfter = await answers();
        await tracking();
        // A second loss, read right away: no read may be answered from a state cached before it; with the
        // copy, reads wait for the restore and answer from it.
        await redis.flushall();
        expect(await answers()).toEqual(copy ? answersAfter : answersAfter.map(() => fresh));
        await waitFor(
          async () => (await metric('paver_sequencer_state_losses_total')) === 2,
          'the second loss counted',
        );
        p.child.kill('SIGTERM');
        expect(await p.exited).toBe(0);
      },
    );
});
