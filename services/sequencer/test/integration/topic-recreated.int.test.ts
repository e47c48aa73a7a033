import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { sequenceStateRecordV1 } from '../../../../schemas/index.js';
import { consumeUntil, createTopics, produce, testKafka, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, ROOT, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

const CONFIG = join(ROOT, 'examples', 'orchestration.yaml');
const call = (session: string, id: string, k: number) => ({
  type: 'tool_call',
  event_id: id,
  ts: 1_760_000_000_000 + k,
  session_id: session,
  task_id: `task-${session}`,
  step: k,
  tool: 'think',
});

describe('sequencer: the tool-calls topic deleted and created again while Redis keeps the sessions', () => {
  it('takes the new topic’s events as new, though their offsets are below the positions stored from the old one', async () => {
    const env = serviceEnv({ SEQUENCER_CONFIG_FILE: CONFIG });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    await createTopics([
      { topic, partitions: 1 },
      { topic: env.PAVER_TOPIC_SEQUENCE_STATE!, partitions: 1 },
    ]);
    const start = async () => {
      const p = await startProcess(['bin/paver.js', 'run', 'sequencer'], env);
      procs.push(p);
      await waitFor(() => isReady(p), 'sequencer /readyz');
      return p;
    };
    const send = (evs: ReturnType<typeof call>[]) =>
      produce(
        topic,
        evs.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
      );
    const records = async (n: number) =>
      (await consumeUntil(env.PAVER_TOPIC_SEQUENCE_STATE!, (all) => all.length >= n))
        .map((m) => sequenceStateRecordV1.parse(JSON.parse(String(m.value))))
        .filter((r) => r.session_id === 'sess-1');

    // Ten events of one session: its stored position is offset 9 of partition 0.
    let p = await start();
    await send(Array.from({ length: 10 }, (_, k) => call('sess-1', `old-${k}`, k)));
    expect(await records(10)).toHaveLength(10);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);

    // The topic is deleted and made again: its offsets start over at 0.
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [topic] });
      await waitFor(async () => !(await admin.listTopics()).includes(topic), 'the topic deleted');
    } finally {
      await admin.disconnect();
    }
    await waitFor(
      () =>
        createTopics([{ topic, partitions: 1 }]).then(
          () => true,
          () => false,
        ),
      'the topic created again',
    );

    // Three new events of the same session at offsets 0..2. Before: skipped as redeliveries (0..2 ≤ 9), nothing
    // published. The partition's high watermark (3) says offset 9 is not of this topic.
    p = await start();
    await send(Array.from({ length: 3 }, (_, k) => call('sess-1', `new-${k}`, 10 + k)));
    const all = await records(13);
    expect(all.map((r) => r.event_id).slice(10)).toEqual(['new-0', 'new-1', 'new-2']);
    p.child.kill('SIGTERM');
    expect(await p.exited).toBe(0);
  });
});
