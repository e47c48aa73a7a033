import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sequenceStateRecordV1, type SequenceStateRecord } from '../../../../schemas/index.js';
import {
  consumeUntil,
  createTopics,
  produce,
  produceInTransactions,
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
const TOOLS = [
  'web_search',
  'http_get',
  'think',
  'reflect',
  'summarize',
  'save',
  'critique',
  'debate',
  'search',
];
const MESSAGES = ['please research this', 'evaluate the answer', 'hello there', 'look up the weather'];

/** Interleaved sessions that mostly follow their sequences, with slips, and redeliveries of earlier events. */
function stream(sessions: number, perSession: number, seed = 5) {
  const r = rng(seed);
  const out: Record<string, unknown>[] = [];
  const cursor = new Array<number>(sessions).fill(0);
  let ts = 1_760_000_000_000;
  for (let i = 0; i < sessions * perSession; i++) {
    const s = Math.floor(r() * sessions);
    const k = cursor[s]!++;
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
    if (i % 53 === 0 && out.length > 3) out.push(out[out.length - 2]!); // a redelivery, one event later
  }
  return out;
}

const events = stream(40, 30);
let offline: SequenceStateRecord[] = [];
beforeAll(async () => {
  const file = join(mkdtempSync(join(tmpdir(), 'paver-seq-')), 'events.jsonl');
  writeFileSync(file, events.map((e) => JSON.stringify(e)).join('\n') + '\n');
  const p = await startProcess(['bin/paver.js', 'sequence', '--config', CONFIG, '--input', file], {
    PATH: process.env.PATH ?? '',
  });
  expect(await p.exited).toBe(0);
  offline = p
    .output()
    .trim()
    .split('\n')
    .map((l) => sequenceStateRecordV1.parse(JSON.parse(l)));
  expect(offline.length).toBeGreaterThan(1000);
  expect(offline.length).toBeLessThan(events.length); // the redeliveries printed nothing
  expect(offline.some((r) => r.violation)).toBe(true);
  expect(offline.some((r) => r.completed)).toBe(true);
});

const bySession = (rs: SequenceStateRecord[]) => {
  const m = new Map<string, SequenceStateRecord[]>();
  for (const r of rs) m.set(r.session_id, [...(m.get(r.session_id) ?? []), r]);
  return m;
};

async function start(env: Record<string, string>) {
  const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
  procs.push(p);
  await waitFor(() => isReady(p), 'sequencer /readyz').catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output()}`);
  });
  return p;
}
async function topics(env: Record<string, string>) {
  await createTopics([
    { topic: env.PAVER_TOPIC_TOOL_CALLS! },
    { topic: env.PAVER_TOPIC_SEQUENCE_STATE! },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    { topic: env.PAVER_TOPIC_ORCHESTRATION!, compacted: true },
  ]);
}
const envFor = (more: Record<string, string> = {}) =>
  serviceEnv({
    SEQUENCER_GROUP_ID: `seq-${Date.now()}-${Math.random()}`,
    PAVER_TOPIC_ORCHESTRATION: `orch-${Date.now()}`,
    SEQUENCER_CONFIG_FILE: CONFIG,
    ...more,
  });

describe('sequencer service (real Kafka, real Redis)', () => {
  for (const emptied of [false, true])
    it(`interleaved sessions with redeliveries and a SIGKILL mid-stream${emptied ? ', Redis emptied while the service is down (the sessions restored from their copy)' : ''}: per session, the same states as the offline command`, async () => {
      const env = envFor({ PAVER_BATCH_CHUNK: '25', KAFKA_MAX_BYTES_PER_PARTITION: '4096' });
      await topics(env);
      const first = await start(env);
      await produce(
        env.PAVER_TOPIC_TOOL_CALLS!,
        events.map((e) => ({ key: e.session_id as string, value: JSON.stringify(e) })),
      );
      await waitFor(
        async () =>
          parsePrometheus(String((await getJson(first.url('/metrics'))).body)).value(
            'paver_sequencer_states_published_total',
          ) > 300,
        'a part of the stream',
      );
      first.child.kill('SIGKILL');
      await first.exited;
      // A Redis restarted without persistence while the service was down: every session state and redelivery
      // guard is gone, and comes back from the session topic at the next start.
      if (emptied) await redis.flushall();
      const second = await start(env);
      if (emptied)
        expect(
          parsePrometheus(String((await getJson(second.url('/metrics'))).body)).value(
            'paver_sequencer_sessions_restored_total',
          ),
        ).toBeGreaterThan(0);

      // Records published before the kill may be published again (at-least-once); a state never advances twice,
      // so after dropping repeated event ids each session's records are exactly the offline ones.
      const all = await consumeUntil(
        env.PAVER_TOPIC_SEQUENCE_STATE!,
        (got) =>
          new Set(
            got.map(
              (m) => JSON.parse(m.value!.toString()).event_id + JSON.parse(m.value!.toString()).session_id,
            ),
          ).size >= offline.length,
      );
      const seen = new Set<string>();
      const live: SequenceStateRecord[] = [];
      for (const m of all) {
        const r = sequenceStateRecordV1.parse(JSON.parse(m.value!.toString()));
        const k = `${r.session_id}/${r.event_id}`;
        if (seen.has(k)) continue;
        seen.add(k);
        live.push(r);
      }
      const want = bySession(offline);
      const got = bySession(live);
      expect([...got.keys()].sort()).toEqual([...want.keys()].sort());
      for (const [s, rs] of want) expect(got.get(s)).toEqual(rs);

      // The HTTP view answers from the stored state: the last record's view for a session (sess-3 does not end on
      // a completion that hands over to another step, where the view would already show the next step).
      const last = want.get('sess-3')!.at(-1)!;
      const res = await getJson(second.url(`/sessions/sess-3/allowed-tools?tools=${TOOLS.join(',')}`));
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({
        session_id: 'sess-3',
        active_step: last.active_step,
        sequence_index: last.sequence_index,
        expected: last.expected,
      });
      second.child.kill('SIGTERM');
      expect(await second.exited).toBe(0);
    });

  it('whole sessions published again under their own ids at new offsets (ingest after a crash) are applied once', async () => {
    const env = envFor();
    await topics(env);
    const p = await start(env);
    const send = (es: Record<string, unknown>[]) =>
      produce(
        env.PAVER_TOPIC_TOOL_CALLS!,
        es.map((e) => ({ key: e.session_id as string, value: JSON.stringify(e) })),
      );
    const metric = async (name: string) =>
      parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name);
    await send(events);
    await waitFor(
      async () => (await metric('paver_sequencer_states_published_total')) >= offline.length,
      'the stream applied',
    );
    const before = await metric('paver_sequencer_redelivered_events_total');
    // Three sessions again, every event of each (about 30: far more than the last few ids a session kept).
    const again = events.filter((e) => ['sess-1', 'sess-2', 'sess-3'].includes(e.session_id as string));
    expect(again.length).toBeGreaterThan(60);
    await send(again);
    await waitFor(
      async () => (await metric('paver_sequencer_redelivered_events_total')) - before >= again.length,
      'the republished events read',
    );
    // Before, only the first few of each session were taken for duplicates: the rest walked the sequences again.
    expect(await metric('paver_sequencer_states_published_total')).toBe(offline.length);
    const last = bySession(offline).get('sess-3')!.at(-1)!;
    const res = await getJson(p.url(`/sessions/sess-3/allowed-tools?tools=${TOOLS.join(',')}`));
    expect(res.body).toMatchObject({
      active_step: last.active_step,
      sequence_index: last.sequence_index,
      expected: last.expected,
    });
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('an agent with no orchestration: no record and no state for an event without visible_tools, counted', async () => {
    const env = envFor();
    await topics(env);
    const p = await start(env);
    const ev = (session_id: string, agent_id: string, i: number, more: Record<string, unknown>) => ({
      event_id: `${session_id}-${i}`,
      ts: 1_760_000_000_000 + i,
      session_id,
      agent_id,
      ...more,
    });
    const callOf = (tool: string, more: Record<string, unknown> = {}) => ({
      type: 'tool_call',
      task_id: 't',
      step: 0,
      tool,
      ...more,
    });
    // One partition, in this order: once the configured agent's record is out, the others were read before it.
    const sent = [
      ev('blind', 'nobody', 0, callOf('web_search')),
      ev('blind', 'nobody', 1, { type: 'user_message', text: 'please research this' }),
      ev('blind', 'nobody', 2, { type: 'task_completed', task_id: 't' }),
      ev('shown', 'nobody', 0, callOf('think', { visible_tools: ['think', 'save'] })),
      ev('known', 'default', 0, callOf('web_search')),
    ];
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      sent.map((e) => ({ key: e.session_id, value: JSON.stringify(e), partition: 0 })),
    );
    const out = await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) =>
      all.some((m) => m.key === 'known'),
    );
    const records = out.map((m) => sequenceStateRecordV1.parse(JSON.parse(m.value!.toString())));
    // Before: three records for 'blind', each with allowed_tools [] (read by a runtime as no tool allowed).
    expect(records.map((r) => [r.session_id, r.allowed_tools])).toEqual([
      ['shown', ['save', 'think']],
      ['known', expect.any(Array)],
    ]);
    const metric = async (name: string, labels?: Record<string, string>) =>
      parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(name, labels);
    await waitFor(
      async () => (await metric('paver_sequencer_events_ignored_total', { reason: 'tools_unknown' })) === 3,
      'the three events counted as ignored',
    );
    expect(await metric('paver_sequencer_states_published_total')).toBe(2);
    // Nothing stored for them: no Redis key, no session-topic record (the events of 'shown' and 'known' have both).
    const key = (agent: string, session: string) =>
      `${env.REDIS_KEY_PREFIX}:seq:{default|${agent}|${session}}`;
    expect(await redis.exists(key('nobody', 'blind'))).toBe(0);
    expect(await redis.exists(key('nobody', 'shown'))).toBe(1);
    const copies = await consumeUntil(env.SEQUENCER_STATE_TOPIC!, (all) =>
      all.some((m) => m.key?.includes('"known"')),
    );
    expect(copies.filter((m) => m.key?.includes('"blind"'))).toEqual([]);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('applies a live orchestration change, dead-letters an inconsistent one, and expires idle sessions', async () => {
    const env = envFor({ SEQUENCER_SESSION_TTL_MS: '2000', SEQUENCER_CONFIG_FILE: '' });
    await topics(env);
    const p = await start(env);
    const redis = testRedis();
    try {
      const agentKey = 'default/default';
      const good = {
        schema_version: 1,
        tools: ['a', 'b', 'c'],
        steps: [
          { name: 'ab', isDefault: true, availableTools: { allowed: ['a', 'b'] }, sequence: ['a', 'b'] },
        ],
      };
      await produce(env.PAVER_TOPIC_ORCHESTRATION!, [{ key: agentKey, value: JSON.stringify(good) }]);
      await waitFor(
        async () =>
          parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
            'paver_sequencer_agents_configured',
          ) === 1,
        'configuration applied',
      );
      const allowed = async (s: string) =>
        (await getJson(p.url(`/sessions/${s}/allowed-tools`))).body as {
          allowed_tools: string[];
          active_step: string | null;
        };
      expect(await allowed('fresh')).toMatchObject({ active_step: 'ab', allowed_tools: ['a'] });

      // Inconsistent: 'c' in the sequence but not allowed. Refused; the previous configuration stays.
      const bad = {
        ...good,
        steps: [{ name: 'ab', isDefault: true, availableTools: { allowed: ['a'] }, sequence: ['a', 'c'] }],
      };
      await produce(env.PAVER_TOPIC_ORCHESTRATION!, [{ key: agentKey, value: JSON.stringify(bad) }]);
      const dlq = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 1);
      expect(dlq[0]!.headers['paver-dlq-reason']).toBe('rejected');
      expect(JSON.parse(dlq[0]!.value!.toString()).detail).toMatch(/step 'ab'.*'c'/);
      expect(await allowed('fresh')).toMatchObject({ allowed_tools: ['a'] });
      // A sequence tool the agent does not declare (allowed by a wildcard): refused too. Before, applied, and the
      // sequence never enforced: 'z' is in no universe, so the step's filter answered instead.
      const undeclared = {
        ...good,
        steps: [{ name: 'az', isDefault: true, availableTools: { allowed: ['*'] }, sequence: ['a', 'z'] }],
      };
      await produce(env.PAVER_TOPIC_ORCHESTRATION!, [{ key: agentKey, value: JSON.stringify(undeclared) }]);
      const dlq2 = await consumeUntil(env.PAVER_TOPIC_DEAD_LETTERS!, (all) => all.length >= 2);
      expect(JSON.parse(dlq2[1]!.value!.toString()).detail).toMatch(
        /agent default\/default: step 'az': sequence tool\(s\) 'z' not in the agent's tools/,
      );
      expect(await allowed('fresh')).toMatchObject({ active_step: 'ab', allowed_tools: ['a'] });

      await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
        {
          key: 'idle',
          value: JSON.stringify({
            type: 'tool_call',
            event_id: 'x1',
            ts: 1,
            session_id: 'idle',
            task_id: 't',
            step: 0,
            tool: 'a',
          }),
        },
      ]);
      const key = `${env.REDIS_KEY_PREFIX}:seq:{default|default|idle}`;
      await waitFor(async () => (await redis.exists(key)) === 1, 'session state written');
      expect(await allowed('idle')).toMatchObject({ allowed_tools: ['b'] });
      // 'idle' was written by this instance: answered from its cache; 'fresh' never was: from Redis.
      const reads = async (source: string) =>
        parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
          'paver_sequencer_state_reads_total',
          { source },
        );
      expect(await reads('cache')).toBeGreaterThanOrEqual(1);
      expect(await reads('redis')).toBeGreaterThanOrEqual(2);
      // Live change: a new sequence applies to the next request, without a restart.
      await produce(env.PAVER_TOPIC_ORCHESTRATION!, [
        {
          key: agentKey,
          value: JSON.stringify({
            ...good,
            steps: [
              { name: 'ab', isDefault: true, availableTools: { allowed: ['a', 'c'] }, sequence: ['a', 'c'] },
            ],
          }),
        },
      ]);
      await waitFor(
        async () => JSON.stringify((await allowed('idle')).allowed_tools) === '["c"]',
        'new configuration in force',
      );
      await waitFor(
        async () => (await redis.exists(key)) === 0,
        'session state expired after the idle TTL',
        10_000,
      );
      // The cached copy never outlives the key: the session reads as new again.
      expect(await allowed('idle')).toMatchObject({ active_step: 'ab', allowed_tools: ['a'] });
    } finally {
      redis.disconnect();
    }
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it("a configuration file with a sequence tool missing from the agent's tools is refused: exit 78, paver sequence exit 2", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-seq-'));
    const file = join(dir, 'orchestration.json');
    writeFileSync(
      file,
      JSON.stringify({
        agents: [
          {
            tenant_id: 'acme',
            agent_id: 'bot',
            tools: ['a', 'b'],
            steps: [{ name: 'az', availableTools: { allowed: ['*'] }, sequence: ['a', 'z'] }],
          },
        ],
      }),
    );
    const named = /agent acme\/bot: step 'az': sequence tool\(s\) 'z' not in the agent's tools/;
    const input = join(dir, 'events.jsonl');
    writeFileSync(input, '');
    const offline = await startProcess(['bin/paver.js', 'sequence', '--config', file, '--input', input], {
      PATH: process.env.PATH ?? '',
    });
    // Before: exit 0 (and the service started with the sequence never enforced).
    expect(await offline.exited).toBe(2);
    expect(offline.output()).toMatch(named);
    const env = envFor({ SEQUENCER_CONFIG_FILE: file });
    await topics(env);
    const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
    procs.push(p);
    expect(await p.exited).toBe(78);
    expect(p.output()).toMatch(named);
  });

  it('a rebalance empties the cache: the previous owner of a session never answers from a state another instance now writes', async () => {
    const env = envFor();
    await topics(env);
    const a = await start(env);
    const cached = async (p: Proc) =>
      parsePrometheus(String((await getJson(p.url('/metrics'))).body)).value(
        'paver_sequencer_state_cache_entries',
      );
    // Sessions on every partition, written (and so cached) by the only instance.
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      events.slice(0, 200).map((e) => ({ key: e.session_id as string, value: JSON.stringify(e) })),
    );
    await waitFor(async () => (await cached(a)) > 10, 'states cached by the first instance');

    // A second instance joins: partitions move, so the first forgets what it cached (no events come after).
    const b = await start(env);
    await waitFor(async () => (await cached(a)) === 0, 'the first instance cache emptied by the rebalance');
    // It still answers, from Redis now.
    const res = await getJson(a.url(`/sessions/sess-3/allowed-tools?tools=${TOOLS.join(',')}`));
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ session_id: 'sess-3' });
    for (const p of [a, b]) p.child.kill('SIGTERM');
    expect(await a.exited).toBe(0);
    expect(await b.exited).toBe(0);
  });

  it('waits for its orchestration table before judging events (no session moved on without its configuration)', async () => {
    // The configuration only on the topic, behind a backlog of other agents' that takes the table a while to
    // read, and no wait for it at start: events already on the topic must not be judged before it is read.
    const env = envFor({ SEQUENCER_CONFIG_FILE: '', SEQUENCER_CONFIG_WAIT_MS: '0' });
    await topics(env);
    const config = (i: number) => ({
      schema_version: 1,
      tools: Array.from({ length: 60 }, (_, t) => `tool_${i}_${t}`),
      steps: [
        {
          name: 'all',
          isDefault: true,
          availableTools: { allowed: [`tool_${i}_0`, `tool_${i}_1`] },
          sequence: [`tool_${i}_0`, `tool_${i}_1`],
        },
      ],
    });
    const backlog = Array.from({ length: 30_000 }, (_, i) => ({
      key: `t/agent-${i}`,
      value: JSON.stringify(config(i)),
    }));
    for (let i = 0; i < backlog.length; i += 3_000)
      await produce(env.PAVER_TOPIC_ORCHESTRATION!, backlog.slice(i, i + 3_000));
    const good = {
      schema_version: 1,
      tools: ['a', 'b', 'c'],
      steps: [{ name: 'ab', isDefault: true, availableTools: { allowed: ['a', 'b'] }, sequence: ['a', 'b'] }],
    };
    await produce(env.PAVER_TOPIC_ORCHESTRATION!, [{ key: 'default/default', value: JSON.stringify(good) }]);
    const calls = ['a', 'b'].map((tool, step) => ({
      type: 'tool_call',
      event_id: `gate-${step}`,
      ts: 1_760_000_000_000 + step,
      session_id: 'gate',
      task_id: 'gate',
      step,
      tool,
    }));
    await produce(
      env.PAVER_TOPIC_TOOL_CALLS!,
      calls.map((e) => ({ key: 'gate', value: JSON.stringify(e) })),
    );
    const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
    procs.push(p);
    // Reads wait for the table too: refused (503) while it is read, never answered as if the agent had no
    // orchestration (before: 200 with no step and every tool of the list, as soon as start-up's wait ended).
    const answers: { status: number; body: unknown }[] = [];
    const first = await waitFor(
      async () => {
        const res = await getJson(p.url('/sessions/gate/allowed-tools?tools=a,b,c'));
        answers.push(res);
        return res.status === 200 && res;
      },
      'an allowed-tools answer',
      120_000,
    );
    expect(first.body).toMatchObject({ active_step: 'ab' });
    expect(
      answers.some((a) => a.status === 503 && JSON.stringify(a.body).includes('orchestration topic')),
      JSON.stringify(answers.slice(-3)),
    ).toBe(true);

    const got = await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) => all.length >= 2);
    const records = got.map((m) => sequenceStateRecordV1.parse(JSON.parse(m.value!.toString())));
    // Judged with its configuration: `a` then `b`, the sequence followed (without it: nothing allowed).
    expect(records.map((r) => [r.event_id, r.allowed_tools, r.violation ?? null])).toEqual([
      ['gate-0', ['b'], null],
      ['gate-1', expect.any(Array), null],
    ]);
    expect(records[1]!.allowed_tools.length).toBeGreaterThan(0);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
  it('reads an orchestration table written in transactions to its end (the last offset a transaction marker)', async () => {
    // An exactly-once writer (Kafka Streams, Connect) ends its table with a marker no consumer is given: the
    // table must still count as read, or the sequencer, which waits for it, would never judge an event.
    const env = envFor({ SEQUENCER_CONFIG_FILE: '', SEQUENCER_CONFIG_WAIT_MS: '0' });
    await topics(env);
    await produceInTransactions(env.PAVER_TOPIC_ORCHESTRATION!, [
      {
        commit: true,
        messages: [
          {
            key: 'default/default',
            value: JSON.stringify({
              schema_version: 1,
              tools: ['a', 'b', 'c'],
              steps: [
                {
                  name: 'ab',
                  isDefault: true,
                  availableTools: { allowed: ['a', 'b'] },
                  sequence: ['a', 'b'],
                },
              ],
            }),
          },
        ],
      },
    ]);
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [
      {
        key: 'tx',
        value: JSON.stringify({
          type: 'tool_call',
          event_id: 'tx-0',
          ts: 1_760_000_000_000,
          session_id: 'tx',
          task_id: 'tx',
          step: 0,
          tool: 'a',
        }),
      },
    ]);
    const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
    procs.push(p);
    const [m] = await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) => all.length >= 1, 60_000);
    const r = sequenceStateRecordV1.parse(JSON.parse(m!.value!.toString()));
    expect([r.event_id, r.allowed_tools, r.violation ?? null]).toEqual(['tx-0', ['b'], null]);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });

  it('warns at start when its session topic keeps records for less than SEQUENCER_SESSION_TTL_MS, and starts', async () => {
    const day = 86_400_000;
    const env = envFor({ SEQUENCER_SESSION_TTL_MS: String(7 * day) });
    await topics(env);
    // Created by an earlier start with the default TTL: raising it later leaves the topic's retention.ms as it was.
    await createTopics([
      {
        topic: env.SEQUENCER_STATE_TOPIC!,
        config: { 'cleanup.policy': 'compact,delete', 'retention.ms': String(day) },
      },
    ]);
    const p = await start(env);
    expect(p.output()).toContain(
      `topic ${env.SEQUENCER_STATE_TOPIC} keeps records retention.ms=${day} but this service asks ${7 * day} ms`,
    );
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
});
