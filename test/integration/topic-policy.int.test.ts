import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compactionProblems, ensureTopics } from '../../shared/kafka/topics.js';
import { createTopics, testKafka, unique, waitFor } from '../helpers/kafka.js';
import { isReady, ROOT, serviceEnv, startProcess, type Proc } from '../helpers/process.js';
import { RECORDER } from '../helpers/recorder.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

describe('topics that must keep the latest record per key (real Kafka)', () => {
  it('reads each topic’s cleanup policy from the broker: compacted, or kept forever, passes; expiring does not', async () => {
    const id = unique('policy');
    const [compact, forever, expiring] = ['compact', 'forever', 'expiring'].map((n) => `${id}.${n}`);
    await createTopics([
      { topic: compact!, partitions: 1, compacted: true },
      { topic: forever!, partitions: 1, config: { 'retention.ms': '-1' } },
      { topic: expiring!, partitions: 1, config: { 'retention.ms': '3600000' } },
    ]);
    const admin = testKafka().admin();
    await admin.connect();
    try {
      const specs = [compact!, forever!, expiring!, `${id}.missing`].map((topic) => ({
        topic,
        compacted: true,
      }));
      const problems = await compactionProblems(admin, specs);
      expect(problems).toHaveLength(1);
      expect(problems[0]).toContain(`topic ${expiring} has cleanup.policy=delete and retention.ms=3600000`);
      // A topic not marked compacted is not looked at.
      expect(await compactionProblems(admin, [{ topic: expiring! }])).toEqual([]);
    } finally {
      await admin.disconnect();
    }
  });

  it('creates topics with the broker’s replication factor when KAFKA_REPLICATION_FACTOR is unset', async () => {
    const topic = unique('rf-default');
    const admin = testKafka().admin();
    await admin.connect();
    try {
      // kafkajs sends -1 (KIP-464): the broker answers with its default.replication.factor (1 on this broker).
      expect(await ensureTopics(admin, [{ topic }], { partitions: 2 })).toEqual([topic]);
      const [meta] = (await admin.fetchTopicMetadata({ topics: [topic] })).topics;
      expect(meta!.partitions).toHaveLength(2);
      for (const p of meta!.partitions) expect(p.replicas).toHaveLength(1);
    } finally {
      await admin.disconnect();
    }
  });

  it('a service refuses to start on a state topic made without compaction (exit 78, naming the topic and the fix)', async () => {
    const env = serviceEnv({ SEQUENCER_CONFIG_FILE: join(ROOT, 'examples', 'orchestration.yaml') });
    // What an operator who creates topics by hand (KAFKA_CREATE_TOPICS=false) might do: a plain topic.
    await createTopics([{ topic: env.SEQUENCER_STATE_TOPIC!, partitions: 1 }]);
    const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
    procs.push(p);
    expect(await p.exited, p.output()).toBe(78);
    expect(p.output()).toContain(`topic ${env.SEQUENCER_STATE_TOPIC} has cleanup.policy=delete`);
    expect(p.output()).toContain('cleanup.policy=[compact,delete]');
  });

  it('with KAFKA_CREATE_TOPICS=false, a topic it writes that does not exist stops the start (exit 78, naming it)', async () => {
    const env = serviceEnv({ FIXTURE_GROUP_ID: unique('g'), KAFKA_CREATE_TOPICS: 'false' });
    // The operator made the input topic but not the dead-letter topic. Before, the service started and said it
    // was ready; the first bad record then failed its dead-letter write, batch after batch and restart after
    // restart, holding its partition until the process gave up.
    await createTopics([{ topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 }]);
    const p = await startProcess(RECORDER, env);
    procs.push(p);
    await waitFor(async () => p.child.exitCode !== null || (await isReady(p)), 'exit or ready');
    expect(await isReady(p), p.output()).toBe(false);
    expect(await p.exited, p.output()).toBe(78);
    expect(p.output()).toContain(env.PAVER_TOPIC_DEAD_LETTERS);
    expect(p.output()).toContain('KAFKA_CREATE_TOPICS');
  });
});
