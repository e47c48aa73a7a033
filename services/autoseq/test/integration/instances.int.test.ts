import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import {
  consumeUntil,
  createTopics,
  groupCaughtUp,
  produce,
  testKafka,
  testRedis,
  waitFor,
} from '../../../../test/helpers/kafka.js';
import { getJson, serviceEnv, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import { startAutoseq } from './predict-compare.js';

/**
 * Two autoseq instances in one group, one scope spread over three partitions: both read-modify-write the
 * scope's learned state at once. Without scope leases the last writer of a batch won: the other batch's
 * learning was lost (the scope's clock, one tick per event applied, fell short of the events), and the
 * counts that decide eviction drifted from the fields they count.
 */
const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

const fixture = join(import.meta.dirname, '../fixtures/tau2-airline-30.jsonl');
const COPIES = 12;

const start = (env: Record<string, string>) => startAutoseq(env, procs);

async function groupMembers(groupId: string): Promise<number> {
  const admin = testKafka().admin();
  await admin.connect();
  try {
    const { groups } = await admin.describeGroups([groupId]);
    return groups[0]?.state === 'Stable' ? groups[0].members.length : 0;
  } finally {
    await admin.disconnect();
  }
}

const base = readFileSync(fixture, 'utf8')
  .trim()
  .split('\n')
  .map((l) => JSON.parse(l) as Record<string, unknown>);
// The same 30 runs again under new task ids: one scope, 360 tasks, sessions spread over the partitions.
const events = Array.from({ length: COPIES }, (_, c) =>
  base.map((e): Record<string, unknown> => ({
    ...e,
    event_id: `${String(e.event_id)}-c${c}`,
    session_id: `${String(e.session_id)}-c${c}`,
    task_id: `${String(e.task_id)}-c${c}`,
  })),
).flat();
const calls = events.filter((e) => e.type === 'tool_call');
const counted = events.filter((e) => e.type === 'tool_call' || e.type === 'task_completed').length;
// The topic's contract names the scope `tenant_id`/`agent_id`; the file's `agent` is not one of them.
const scopeKey = (env: Record<string, string>, name: string) =>
  `${env.REDIS_KEY_PREFIX}:aseq:{default|default}:${name}`;
const eventIds = (all: { value: Buffer | null }[]) =>
  new Set(all.map((m) => (JSON.parse(m.value!.toString()) as { event_id: string }).event_id));

/** Two instances in one group, ready, before the whole stream is published to 3 partitions. */
async function twoInstances(name: string) {
  const env = serviceEnv({
    AUTOSEQ_GROUP_ID: `${name}-${Date.now()}`,
    PAVER_TOPIC_TOOL_CATALOG: `cat-${name}-${Date.now()}`,
    AUTOSEQ_CATALOG_WAIT_MS: '0',
    // Small batches: many read-modify-write rounds per instance, so the two overlap again and again.
    KAFKA_MAX_BYTES_PER_PARTITION: '16384',
    // Small bounds: eviction runs, and it trusts the counts.
    AUTOSEQ_LEARN_MAX_CONTEXTS: '40',
    AUTOSEQ_LEARN_MAX_SLOTS: '20',
  });
  await createTopics([
    { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 3 },
    { topic: env.PAVER_TOPIC_NEXT_ACTIONS!, partitions: 3 },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS!, partitions: 1 },
    { topic: env.PAVER_TOPIC_TOOL_CATALOG!, partitions: 1, compacted: true },
  ]);
  const a = await start(env);
  const b = await start(env);
  await waitFor(
    async () => (await groupMembers(env.AUTOSEQ_GROUP_ID!)) === 2,
    'both instances in the group',
    60_000,
  );
  await produce(
    env.PAVER_TOPIC_TOOL_CALLS!,
    events.map((e) => ({ key: String(e.session_id), value: JSON.stringify(e) })),
  );
  return { env, a, b };
}

/** Every call has its record and every offset is committed. */
async function allDone(env: Record<string, string>) {
  const want = calls.map((e) => String(e.event_id));
  await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => {
    const got = eventIds(all);
    return want.every((id) => got.has(id));
  });
  await waitFor(
    () => groupCaughtUp(env.AUTOSEQ_GROUP_ID!, env.PAVER_TOPIC_TOOL_CALLS!),
    'offsets committed',
    60_000,
  );
}

/**
 * One tick of the scope's clock per tool_call and task_completed applied: each exactly once (a redelivered
 * one whose first application was written is a duplicate; one whose write was lost is applied again). The
 * counts that decide eviction equal the fields they count, and every lease went back.
 */
async function expectScopeWhole(env: Record<string, string>) {
  const redis = testRedis();
  try {
    const all = await redis.hgetall(scopeKey(env, 'rules'));
    expect(all.m, 'the scope has learned state').toBeDefined();
    const meta = JSON.parse(all.m!) as { clock: number; nCtx: number; nSlots: number };
    const groups = Object.entries(all).filter(([f]) => f.startsWith('c:'));
    const slots = groups.reduce((n, [, v]) => n + Object.keys((JSON.parse(v) as { s: object }).s).length, 0);
    expect(meta.clock).toBe(counted);
    expect(meta.nCtx).toBe(groups.length);
    expect(meta.nSlots).toBe(slots);
    expect(await redis.exists(scopeKey(env, 'lease'))).toBe(0);
  } finally {
    redis.disconnect();
  }
}

const metrics = async (p: Proc) => parsePrometheus(String((await getJson(p.url('/metrics'))).body));

describe('autoseq: two instances learning in one scope (real Kafka, real Redis)', () => {
  it('loses no learning: every event is counted once in the scope, whose counts match its fields', async () => {
    const { env, a, b } = await twoInstances('aseq-two');
    await allDone(env);
    const [ma, mb] = [await metrics(a), await metrics(b)];
    const consumed = (m: typeof ma) => m.value('paver_events_consumed_total', { outcome: 'processed' });
    // Both instances learned in the scope, and at least once one waited for the other.
    expect(consumed(ma)).toBeGreaterThan(0);
    expect(consumed(mb)).toBeGreaterThan(0);
    expect(consumed(ma) + consumed(mb)).toBeGreaterThanOrEqual(events.length);
    expect(
      ma.value('paver_autoseq_scope_lease_waits_total') + mb.value('paver_autoseq_scope_lease_waits_total'),
    ).toBeGreaterThan(0);
    expect(ma.value('paver_dead_letters_total') + mb.value('paver_dead_letters_total')).toBe(0);
    await expectScopeWhole(env);

    for (const p of [a, b]) p.child.kill('SIGTERM');
    expect(await a.exited).toBe(0);
    expect(await b.exited).toBe(0);
  }, 240_000);

  it('an instance SIGKILLed mid-stream (holding leases, records out, state unwritten) loses and doubles nothing', async () => {
    const { env, a, b } = await twoInstances('aseq-kill');
    // Killed once a quarter of the calls have records: mid-stream, with its partitions' batches in flight.
    await consumeUntil(env.PAVER_TOPIC_NEXT_ACTIONS!, (all) => eventIds(all).size >= calls.length / 4);
    a.child.kill('SIGKILL');
    await a.exited;
    // The survivor takes the dead one's partitions (after the session timeout) and its scope (after the lease).
    await allDone(env).catch((err: Error) => {
      throw new Error(`${err.message}\n${b.output().slice(-6000)}`);
    });
    expect((await metrics(b)).value('paver_dead_letters_total')).toBe(0);
    await expectScopeWhole(env);
    b.child.kill('SIGTERM');
    expect(await b.exited).toBe(0);
  }, 240_000);
});
