import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { createTopics, testKafka, waitFor } from '../../../../test/helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../../../../test/helpers/own-redis.js';
import { serviceEnv, type Proc, stopPromptly } from '../../../../test/helpers/process.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { withRequests } from '../reference/requests.js';
import { candidates, detectOffline, metrics, PARAMS, startDetector } from './backlog.js';

/*
 * A stop during a rebuild. Redis is lost (FLUSHALL) and the next chunk replays a long stretch of the partition
 * from its checkpoint; a SIGTERM meanwhile must end the replay between batches and the process with 0, the
 * chunk that started it uncommitted and the partition not marked rebuilt, so that the next start rebuilds it
 * again and ends with the candidates `paver detect` gives over the same events. Before, the replay ran on under
 * the stop, and the process committed that chunk and left only when it was over (or, past
 * PAVER_SHUTDOWN_TIMEOUT_MS, with exit 1).
 */
const events = withRequests([...agentEvents({ tasks: 600, seed: 23 })]);

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  stopOwnRedis();
});

describe('detector: a stop during a rebuild (real Kafka, a redis-server of its own)', () => {
  it('exits 0 at once on SIGTERM, commits nothing of the rebuilt chunk, and the next start rebuilds it', async () => {
    const offline = await detectOffline(events);
    expect(offline.length).toBeGreaterThan(0);
    const redisServer = await ownRedis();
    const env = serviceEnv({
      ...PARAMS,
      REDIS_URL: redisServer.url,
      // One small record batch per fetch: the replay takes many fetches, and a while.
      KAFKA_MAX_BYTES_PER_PARTITION: '1024',
      PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
    });
    env.DETECTOR_TOPIC_CHECKPOINTS = `${env.PAVER_TOPIC_TOOL_CALLS!}.detector-checkpoints`;
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    const group = env.DETECTOR_GROUP_ID!;
    await createTopics([
      { topic, partitions: 1 },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const producer = testKafka().producer();
    await producer.connect();
    const send = async (part: typeof events) => {
      for (let i = 0; i < part.length; i += 5)
        await producer.send({
          topic,
          acks: -1,
          messages: part.slice(i, i + 5).map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
        });
    };
    const admin = testKafka().admin();
    await admin.connect();
    const committed = async () =>
      BigInt((await admin.fetchOffsets({ groupId: group, topics: [topic] }))[0]!.partitions[0]!.offset);
    const head = 300;
    const tail = events.length - 300;

    // The head handled by a first process: its state built, its checkpoint written at its start.
    await send(events.slice(0, head));
    const first = await startDetector(env, procs);
    await waitFor(async () => (await committed()) === BigInt(head), 'the head handled');
    first.child.kill('SIGTERM');
    expect(await first.exited).toBe(0);

    // A long stretch after it, handled as far as the group knows (committed past it): only a rebuild reads it.
    await send(events.slice(head, tail));
    const [end] = await admin.fetchTopicOffsets(topic);
    const stretch = BigInt(end!.high);
    await admin.setOffsets({ groupId: group, topic, partitions: [{ partition: 0, offset: end!.high }] });

    const second = await startDetector(env, procs);
    const r = new Redis(redisServer.url);
    await r.flushall();
    r.disconnect();
    // The rest: its first chunk finds the state gone and replays the partition from its checkpoint first.
    await send(events.slice(tail));
    await waitFor(
      async () => (await metrics(second)).value('paver_detector_rebuilding') === 1,
      'the rebuild under way',
    );
    // Far below PAVER_SHUTDOWN_TIMEOUT_MS: the stop did not wait for its work.
    const code = await stopPromptly(second);
    expect(code, second.output().slice(-3000)).toBe(0);
    // The chunk that started the rebuild was given back, and the partition was not marked rebuilt.
    expect(await committed()).toBe(stretch);
    expect(second.output()).not.toContain('detector partition state rebuilt from Kafka');
    expect(second.output()).toContain('detector state rebuild stopped');

    const third = await startDetector(env, procs);
    await waitFor(async () => (await committed()) === BigInt(events.length), 'the rest handled', 120_000);
    await waitFor(
      async () => JSON.stringify(await candidates(third)) === JSON.stringify(offline),
      'live candidates equal to the offline run',
      60_000,
    ).catch(async (err: Error) => {
      throw new Error(
        `${err.message}\nlive: ${JSON.stringify(await candidates(third)).slice(0, 2000)}\n${third.output().slice(-4000)}`,
      );
    });
    const m = await metrics(third);
    expect(m.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' })).toBeGreaterThanOrEqual(1);
    // The whole stretch was read again, from the checkpoint the first process wrote.
    expect(m.value('paver_detector_rebuild_events_total')).toBeGreaterThanOrEqual(Number(stretch) - head);
    expect(m.value('paver_dead_letters_total')).toBe(0);
    third.child.kill('SIGTERM');
    expect(await third.exited).toBe(0);
    await producer.disconnect();
    await admin.disconnect();
  }, 300_000);
});
