import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { sequenceStateRecordV1, type SequenceStateRecord } from '../../../../schemas/index.js';
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
import {
  getJson,
  isReady,
  ROOT,
  serviceEnv,
  startProcess,
  type Proc,
  stopPromptly,
} from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { restoreFlagKey } from '../../../../shared/redis/epoch.js';
import { rng } from '../../../../testkit/streams.js';

const procs: Proc[] = [];
const redis = testRedis();
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  await redis.quit();
  stopOwnRedis();
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
        // A second loss: no read may be answered from a state cached before it; with the copy, reads wait for the
        // restore and answer from it. Tracked, the loss is noticed when its invalidation arrives (README, "The
        // price"): read the instant FLUSHALL returned, on a starved machine a read could come first and be
        // answered from the cache, which only the variant without the copy can tell. So the reads go once the
        // sequencer has heard it (tracking stays off until a check finds nothing lost, and no check runs
        // meanwhile: the stream is caught up and nothing else reads).
        await redis.flushall();
        await waitFor(
          async () => (await metric('paver_sequencer_epoch_tracking')) === 0,
          'the FLUSHALL invalidation heard',
        );
        expect(await answers()).toEqual(copy ? answersAfter : answersAfter.map(() => fresh));
        await waitFor(
          async () => (await metric('paver_sequencer_state_losses_total')) === 2,
          'the second loss counted',
        );
        p.child.kill('SIGTERM');
        expect(await p.exited).toBe(0);
      },
    );

  it('honours a SIGTERM during a long restore: exits 0 at once, the restore stays owed, and the next start restores every session', async () => {
    // Before, the restore ran on under the stop, the batch waiting for it was then handled and committed by a
    // process told to stop, and a restore longer than PAVER_SHUTDOWN_TIMEOUT_MS ended in exit 1.
    const own = await ownRedis();
    const env = serviceEnv({
      REDIS_URL: own.url,
      SEQUENCER_GROUP_ID: `seq-stop-${Date.now()}`,
      PAVER_TOPIC_ORCHESTRATION: `orch-stop-${Date.now()}`,
      SEQUENCER_CONFIG_FILE: CONFIG,
      // Every epoch check a GET: the batch after the FLUSHALL finds the loss itself, with no invalidation to wait for.
      SEQUENCER_EPOCH_HEARTBEAT_MS: '0',
      // One small record batch per fetch: reading the session topic takes many fetches, and a while.
      KAFKA_MAX_BYTES_PER_PARTITION: '1024',
      PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
    });
    const stateTopic = env.SEQUENCER_STATE_TOPIC!;
    const toolCalls = env.PAVER_TOPIC_TOOL_CALLS!;
    const group = env.SEQUENCER_GROUP_ID!;
    await createTopics([
      { topic: toolCalls },
      { topic: env.PAVER_TOPIC_SEQUENCE_STATE! },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
      { topic: env.PAVER_TOPIC_ORCHESTRATION!, compacted: true },
      { topic: stateTopic, partitions: 1, compacted: true },
    ]);
    // A long stretch of another deployment's sessions (another key prefix: read, then skipped) ahead of this
    // one's on the session topic, each record alone in a fetch (over KAFKA_MAX_BYTES_PER_PARTITION): a restore
    // reads all of them, one fetch each, before it reaches the sessions below.
    const PAD = 8000;
    const filler = 'x'.repeat(1024);
    await produceOnePerBatch(stateTopic, PAD, (i) => ({
      key: JSON.stringify(['elsewhere', 'default', 'default', `pad-${i}`]),
      value: JSON.stringify({ v: 1, value: `1|${filler}`, at: Date.now() }),
    }));

    const start = async () => {
      const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
      procs.push(p);
      return p;
    };
    const sessions = 12;
    const before = events(sessions, 10, 3, 0);
    const next = events(sessions, 1, 4, 10).filter((e) => e.session_id === 'sess-0');
    const send = (evs: Record<string, unknown>[]) =>
      produce(
        toolCalls,
        evs.map((e) => ({ key: e.session_id as string, value: JSON.stringify(e) })),
      );
    const answers = (p: Proc) =>
      Promise.all(
        [...Array(sessions).keys()].map(async (s) => {
          const { session_id: _, ...answer } = (
            await getJson(p.url(`/sessions/sess-${s}/allowed-tools?tools=${TOOLS.join(',')}`))
          ).body as { session_id: string };
          return answer;
        }),
      );
    const metric = async (p: Proc, name: string) =>
      parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name);

    const r = new Redis(own.url);
    const flag = restoreFlagKey(`${env.REDIS_KEY_PREFIX}:seq:epoch`);
    // A marker without its flag: a Redis that lost nothing, so the first start does not restore.
    await r.set(`${env.REDIS_KEY_PREFIX}:seq:epoch`, 'before');
    const first = await start();
    await waitFor(() => isReady(first), 'sequencer /readyz');
    await send(before);
    await waitFor(() => groupCaughtUp(group, toolCalls), 'the events before the loss committed');
    const answersBefore = await answers(first);

    await r.flushall();
    // Its batch finds the state gone and waits for the restore.
    await send(next);
    await waitFor(
      async () => (await metric(first, 'paver_sequencer_state_losses_total')) === 1,
      'the restore under way',
    );
    // Far below PAVER_SHUTDOWN_TIMEOUT_MS: the stop did not wait for its work.
    const code = await stopPromptly(first);
    expect(code, first.output().slice(-3000)).toBe(0);
    expect(first.output()).not.toContain('session states restored from the session topic');
    expect(first.output()).toContain('redis state rebuild stopped by the stop');
    // The batch that waited was given back, and the restore is still owed: its flag says so.
    expect(await groupCaughtUp(group, toolCalls)).toBe(false);
    expect(await r.exists(flag)).toBe(1);

    const second = await start();
    await waitFor(
      () => groupCaughtUp(group, toolCalls),
      'the event after the loss handled after the restart',
      120_000,
    );
    expect(await metric(second, 'paver_sequencer_sessions_restored_total')).toBe(sessions);
    expect(await r.exists(flag)).toBe(0);
    // Every session as it was, and sess-0 moved on from its restored state as a whole run offline says.
    const after = await answers(second);
    expect(after.slice(1)).toEqual(answersBefore.slice(1));
    const whole = await offline([...before, ...next]);
    const states = await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) =>
      all.some(
        (m) => (JSON.parse(m.value!.toString()) as { event_id: string }).event_id === next[0]!.event_id,
      ),
    );
    const last = states
      .map((m) => sequenceStateRecordV1.parse(JSON.parse(m.value!.toString())))
      .filter((x) => x.event_id === next[0]!.event_id);
    expect(last.at(-1)).toEqual(whole.get('sess-0')!.at(-1));
    r.disconnect();
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
  }, 300_000);
});
