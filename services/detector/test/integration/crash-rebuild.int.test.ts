import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import {
  consumeUntil,
  createTopics,
  produce,
  testKafka,
  waitFor,
  type Consumed,
} from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../../../../test/helpers/own-redis.js';
import { serviceEnv, type Proc } from '../../../../test/helpers/process.js';
import { flowCandidateRecordV1, type FlowCandidate } from '../../../../schemas/index.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { candidateKey, toRecord } from '../../src/core/candidate.js';
import { withRequests } from '../reference/requests.js';
import { candidates, detectOffline, PARAMS, startDetector } from './backlog.js';

/*
 * A crash in the middle of a rebuild. After a Redis loss a partition is replayed from Kafka and the publication
 * maps (which candidates the topic holds as active, per scope) are restored from the flow-candidates topic;
 * then the partition is marked rebuilt, and every later process trusts the mark. Before, the mark came first:
 * a process killed between the two left the maps empty for good, and a candidate published before the loss
 * that is no longer live was never retracted.
 */
const events = withRequests([...agentEvents({ tasks: 600, seed: 23 })]);
/**
 * A quiet scope (`agent-1`): its tasks come first, stamped before the others, and none after the loss, so no
 * batch publishes it once the detector is back.
 */
const quiet = withRequests([...agentEvents({ tasks: 40, seed: 5, startTs: 1_759_990_000_000 })]).map((e) => {
  const q = (v: unknown) => (typeof v === 'string' ? `q-${v}` : v);
  return {
    ...e,
    agent_id: 'agent-1',
    session_id: q(e.session_id) as string,
    event_id: q(e.event_id) as string,
    ...('task_id' in e ? { task_id: q(e.task_id) } : {}),
  };
});

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  stopOwnRedis();
});

/** The candidates the topic holds as active (the latest record per key), by dedupe_key. */
function activeOnTopic(all: Consumed[]): string[] {
  const latest = new Map<string, { status: string; dedupe_key: string }>();
  for (const m of all)
    if (m.key !== null && m.value !== null && m.value.toString().startsWith('{'))
      latest.set(m.key, JSON.parse(m.value.toString()));
  return [...latest.values()]
    .filter((r) => r.status === 'active')
    .map((r) => r.dedupe_key)
    .sort();
}

describe('detector: killed between a partition rebuild and its publication restore (real Kafka, a redis-server of its own)', () => {
  it('the next process still retracts what was published before the loss and is no longer live', async () => {
    const offline = await detectOffline(events);
    expect(offline.length).toBeGreaterThan(0);
    const offlineQuiet = await detectOffline(quiet);
    const redisServer = await ownRedis();
    const env = serviceEnv({
      ...PARAMS,
      REDIS_URL: redisServer.url,
      // Small fetches: the publication restore reads a long candidates topic in many of them, and takes a while.
      KAFKA_MAX_BYTES_PER_PARTITION: '2048',
    });
    env.DETECTOR_TOPIC_CHECKPOINTS = `${env.PAVER_TOPIC_TOOL_CALLS!}.detector-checkpoints`;
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const candidatesTopic = env.PAVER_TOPIC_FLOW_CANDIDATES!;
    await createTopics([
      { topic, partitions: 1 },
      { topic: candidatesTopic, compacted: true },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const send = (part: { session_id: string }[]) =>
      produce(
        topic,
        part.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
      );
    const admin = testKafka().admin();
    await admin.connect();
    const committed = async () =>
      BigInt(
        (await admin.fetchOffsets({ groupId: env.DETECTOR_GROUP_ID!, topics: [topic] }))[0]!.partitions[0]!
          .offset,
      );
    const head = events.length - 40;
    await send([...quiet, ...events.slice(0, head)]);
    const first = await startDetector(env, procs);
    const handled = quiet.length + head;
    await waitFor(async () => (await committed()) === BigInt(handled), 'the head handled', 120_000);

    // A candidate the topic holds as active that is not live (published before the loss, as far as the topic
    // knows), in a scope with events after the loss and in the quiet one, then a long run of other records: the
    // restore reads them all.
    const stale = {
      ...(offline[0] as unknown as FlowCandidate),
      tool_sequence: ['stale_a', 'stale_b', 'stale_c'],
      dedupe_key: 'flow_offload:stale_a>stale_b>stale_c',
    };
    const staleIn = (agent: string) => {
      const scope = { tenant: 'default', agent };
      return {
        key: candidateKey(scope, stale.dedupe_key),
        value: JSON.stringify(flowCandidateRecordV1.parse(toRecord(stale, scope, Date.now()))),
      };
    };
    await produce(candidatesTopic, [
      staleIn('agent-0'),
      staleIn('agent-1'),
      ...Array.from({ length: 20_000 }, (_, i) => ({ key: `filler-${i}`, value: 'not a candidate' })),
    ]);

    // Killed the moment it logs the partition rebuilt (the log line follows the mark).
    let seen = '';
    first.child.stderr!.on('data', (d: Buffer) => {
      seen = (seen + d.toString()).slice(-4096);
      if (seen.includes('detector partition state rebuilt from Kafka')) first.child.kill('SIGKILL');
    });
    const r = new Redis(redisServer.url);
    await r.flushall();
    r.disconnect();
    // The tail's first chunk finds the state gone: the partition is replayed and the publication restored.
    await send(events.slice(head));
    await waitFor(
      () => first.child.exitCode !== null || first.child.signalCode !== null,
      'the kill',
      120_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}\n${first.output().slice(-3000)}`);
    });
    expect(first.output()).toContain('detector partition state rebuilt from Kafka');
    // Killed before its chunk was committed: the next process handles it again.
    expect(await committed()).toBe(BigInt(handled));

    const second = await startDetector(env, procs);
    await waitFor(
      async () => (await committed()) === BigInt(quiet.length + events.length),
      'the tail handled',
      120_000,
    );
    await waitFor(
      async () => JSON.stringify(await candidates(second)) === JSON.stringify(offline),
      'live candidates equal to the offline run',
      60_000,
    );
    // The topic agrees: the stale candidates were retracted, the quiet scope's too (by the sweep: it gets no
    // batch), and what is active is the offline answer of each scope.
    const want = JSON.stringify(
      [...offline, ...offlineQuiet].map((c) => (c as { dedupe_key?: string }).dedupe_key).sort(),
    );
    const all = await consumeUntil(
      candidatesTopic,
      (got) => JSON.stringify(activeOnTopic(got)) === want,
    ).catch((err: Error) => {
      throw new Error(`${err.message}\n${second.output().slice(-3000)}`);
    });
    expect(activeOnTopic(all)).not.toContain(stale.dedupe_key);
    second.child.kill('SIGTERM');
    expect(await second.exited).toBe(0);
    await admin.disconnect();
  }, 300_000);
});
