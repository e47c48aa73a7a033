import { describe, expect, it } from 'vitest';
import { createTopics, produceInTransactions, testKafka, unique } from '../helpers/kafka.js';
import { readToEnd } from '../../shared/kafka/replay.js';

describe('replay reader (real Kafka)', () => {
  it('reads a topic written in transactions to its end, an aborted transaction last (no batch is ever given for it)', async () => {
    const topic = unique('replay-tx');
    await createTopics([{ topic, partitions: 2 }]);
    const tx = (from: number, n: number, commit: boolean) => ({
      commit,
      messages: Array.from({ length: n }, (_, i) => ({ key: `k${(from + i) % 5}`, value: `v${from + i}` })),
    });
    await produceInTransactions(topic, [tx(0, 50, true), tx(50, 10, false)]);

    const read: string[] = [];
    const replay = readToEnd(
      {
        kafka: testKafka(),
        topic,
        groupPrefix: unique('g'),
        sessionTimeoutMs: 10_000,
        // One record batch a fetch: the aborted transaction and its marker come in fetches of their own.
        maxBytesPerPartition: 256,
      },
      async (_p, messages) => {
        for (const m of messages) read.push(m.value!.toString());
      },
    );
    // Before: the read waited for good on a partition whose last records were never given to it.
    const outcome = await Promise.race([
      replay.then(() => 'done'),
      new Promise((r) => setTimeout(() => r('still waiting'), 45_000).unref()),
    ]);
    expect(outcome).toBe('done');
    expect(read.sort()).toEqual(Array.from({ length: 50 }, (_, i) => `v${i}`).sort());
  });
});
