import { Registry } from 'prom-client';
import { describe, expect, it, vi } from 'vitest';
import { PaverError } from '../../shared/errors.js';
import { createMetrics } from '../../shared/metrics.js';
import {
  loggedBatch,
  oneRecordBatch,
  rebalancingError,
  rejection,
  standInConsumer,
  standInKafka,
  standInRunner,
} from '../helpers/stand-in-consumer.js';
import { toolCall } from '../helpers/tool-call.js';

/**
 * The consumer side of kafkajs as the runner sees it, one partition, with kafkajs's offset rules: the next fetch
 * starts at the last resolved offset of this generation (committed offsets only at a join), and a batch that
 * throws a non-membership error is fetched again by kafkajs's retrier within the same generation.
 */
function fakeKafka(
  log: { offset: string; value: Buffer }[],
  failCommits: number,
  heartbeat: () => Promise<void> = async () => undefined,
) {
  let failure: unknown = null;
  let resolved = 0n;
  let committed: bigint | null = null;
  const consumer = standInConsumer();
  /** One fetch and its batch, as kafkajs's fetch loop runs it; false when there was nothing to fetch. */
  async function fetchOnce(): Promise<boolean> {
    const messages = log
      .filter((m) => BigInt(m.offset) >= resolved)
      .map((m) => ({ ...m, key: Buffer.from('s'), timestamp: '1700000000000', headers: {} }));
    if (messages.length === 0) return false;
    await consumer.eachBatch!({
      batch: {
        topic: 't',
        partition: 0,
        highWatermark: String(log.length),
        messages,
        lastOffset: () => messages[messages.length - 1]!.offset,
      },
      resolveOffset: (o: string) => (resolved = BigInt(o) + 1n),
      commitOffsetsIfNecessary: async (o: { topics: { partitions: { offset: string }[] }[] }) => {
        if (failCommits-- > 0)
          // What a coordinator moving or a request timing out gives: retriable, not a rebalance.
          throw Object.assign(new Error('Connection timeout'), {
            name: 'KafkaJSConnectionError',
            retriable: true,
          });
        committed = BigInt(o.topics[0]!.partitions[0]!.offset);
      },
      heartbeat,
      pause: () => () => undefined,
      isRunning: () => true,
      isStale: () => false,
    }).catch((err: unknown) => (failure = err));
    return true;
  }
  const admin = () => ({
    connect: async () => undefined,
    disconnect: async () => undefined,
    fetchOffsets: async () => [],
    setOffsets: async () => undefined,
  });
  return {
    kafka: { consumer: () => consumer, admin } as never,
    fetchOnce,
    committed: () => committed,
    /** What the last failed batch threw to kafkajs. */
    failure: () => failure,
  };
}

describe('consumer runner: a commit that fails', () => {
  it('is not lost: the chunk is read again and committed, so the group reaches the end of the partition', async () => {
    const log = [0, 1, 2, 3, 4].map((i) => ({
      offset: String(i),
      value: Buffer.from(JSON.stringify(toolCall(i))),
    }));
    const k = fakeKafka(log, 1);
    const seen: string[] = [];
    const fatal: Error[] = [];
    const runner = standInRunner(k.kafka, {
      handler: async (records) => {
        for (const r of records) seen.push(r.value.event_id);
      },
      onFatal: (e) => fatal.push(e),
    });
    await runner.start();
    try {
      // kafkajs fetches until nothing is left to fetch (a few rounds at most here).
      for (let round = 0; round < 5 && (await k.fetchOnce()); round++);
      expect(fatal).toEqual([]);
      // Every record was handled (at least once), and the group's committed offset is the partition's end:
      // the lag the group shows, and where the next owner starts, are right.
      expect(new Set(seen)).toEqual(new Set(['e0', 'e1', 'e2', 'e3', 'e4']));
      expect(k.committed()).toBe(5n);
    } finally {
      await runner.stop();
    }
  });
});

describe('consumer runner: a rebalance while a chunk is retried', () => {
  it('ends the retries at once and hands the rebalance to kafkajs (the group does not wait for them)', async () => {
    const log = [0, 1].map((i) => ({ offset: String(i), value: Buffer.from(JSON.stringify(toolCall(i))) }));
    // The group is rebalancing (another instance joined): every heartbeat says so, as kafkajs reports it.
    const rebalancing = rebalancingError();
    const k = fakeKafka(log, 0, () => Promise.reject(rebalancing));
    let calls = 0;
    const runner = standInRunner(
      k.kafka,
      {
        handler: async () => {
          calls++;
          // A dependency failing transiently (the service's Redis answering BUSY, say), Redis still connected.
          throw new PaverError('REDIS_UNAVAILABLE', 'BUSY');
        },
      },
      { PAVER_RETRY_ATTEMPTS: '8', PAVER_RETRY_INITIAL_MS: '1', PAVER_RETRY_MAX_MS: '1' },
    );
    await runner.start();
    try {
      await k.fetchOnce();
      // Before, the heartbeat before each retry swallowed the rebalance, and the chunk ran all its attempts
      // (about 25 s with the default backoff) while every other member of the group waited.
      expect(calls).toBe(1);
      expect(k.failure()).toBe(rebalancing);
    } finally {
      await runner.stop();
    }
  });
});

describe('consumer runner: the commit past records no consumer is given (transaction markers)', () => {
  /** kafkajs's END_BATCH_PROCESS for a fetch of partition 0 that held only a marker, at offset `last`. */
  const markerOnly = (last: number) => ({
    topic: 't',
    partition: 0,
    batchSize: 0,
    lastOffset: String(last),
    highWatermark: String(last + 1),
  });
  const timeout = () =>
    Object.assign(new Error('Request Offset Commit(key: 8, version: 5) timed out'), {
      name: 'KafkaJSNumberOfRetriesExceeded',
      retriable: false,
    });

  it('that fails is counted and tried again at the next fetch, without an unhandled rejection', async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (err: unknown) => unhandled.push(err);
    process.on('unhandledRejection', onUnhandled);
    const consumer = standInConsumer();
    const commits: string[] = [];
    let failures = 1;
    consumer.commitOffsets = async (offsets) => {
      commits.push(offsets.map((o) => `${o.partition}@${o.offset}`).join(','));
      if (failures-- > 0) throw timeout();
    };
    const metrics = createMetrics('test', new Registry());
    const runner = standInRunner(standInKafka(consumer), { metrics });
    await runner.start();
    try {
      // The partition is idle after the marker: no batch of it comes to commit past it instead.
      consumer.emit('end', markerOnly(4));
      await vi.waitFor(() => expect(commits).toEqual(['0@5']));
      await vi.waitFor(async () =>
        expect((await metrics.markerCommitFailures.get()).values[0]?.value).toBe(1),
      );
      // kafkajs fetches again (every KAFKA_MAX_WAIT_MS at most on an idle topic): the commit is owed still.
      consumer.emit('fetch', { nodeId: 0 });
      await vi.waitFor(() => expect(commits).toEqual(['0@5', '0@5']));
      // Committed now: the next fetch has nothing to commit.
      consumer.emit('fetch', { nodeId: 0 });
      for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
      expect(commits).toEqual(['0@5', '0@5']);
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      await runner.stop();
    }
  });

  it('still in flight does not land after the next batch of its partition commits further (no step back)', async () => {
    const consumer = standInConsumer();
    /** The group's committed offset of partition 0, as the broker applies each commit in turn. */
    const applied: string[] = [];
    let answer!: () => void;
    consumer.commitOffsets = (offsets) =>
      // A commit the coordinator answers late (kafkajs retries it meanwhile, and it lands once answered).
      new Promise<void>((r) => (answer = r)).then(() => void applied.push(offsets[0]!.offset));
    const runner = standInRunner(standInKafka(consumer));
    await runner.start();
    try {
      consumer.emit('end', markerOnly(4));
      await vi.waitFor(() => expect(answer).toBeDefined());
      const batch = {
        ...oneRecordBatch([]),
        batch: {
          topic: 't',
          partition: 0,
          highWatermark: '7',
          messages: [5, 6].map((i) => ({
            offset: String(i),
            key: Buffer.from('s'),
            value: Buffer.from(JSON.stringify(toolCall(i))),
            timestamp: '0',
            headers: {},
          })),
          lastOffset: () => '6',
        },
        commitOffsetsIfNecessary: async (o: { topics: { partitions: { offset: string }[] }[] }) =>
          void applied.push(o.topics[0]!.partitions[0]!.offset),
      };
      const done = consumer.eachBatch!(batch);
      // One turn of the event loop: whatever the batch can do without the coordinator's answer, it has done.
      await new Promise((r) => setImmediate(r));
      answer();
      await done;
      // Before, the batch committed 7 and the marker's late commit then set the group back to 5.
      expect(applied).toEqual(['5', '7']);
    } finally {
      await runner.stop();
    }
  });
});

describe('consumer runner: a rebalance the heartbeat timer meets during a long chunk', () => {
  it('tells the handler to stop (ctx.isRunning), commits nothing and hands the rebalance to kafkajs', async () => {
    const rebalancing = rebalancingError();
    const consumer = standInConsumer();
    let beats = 0;
    const log: string[] = [];
    const fatal: Error[] = [];
    let runningAfterBeat: boolean | null = null;
    const runner = standInRunner(
      standInKafka(consumer),
      {
        // A long handler working in steps (a replay, a model call per record), asking between them whether to go on.
        handler: async (_records, ctx) => {
          await vi.waitFor(() => expect(beats).toBeGreaterThan(0), { timeout: 10_000 });
          runningAfterBeat = ctx.isRunning();
          if (!runningAfterBeat) throw new PaverError('SHUTTING_DOWN', 'stopped between steps');
        },
        onFatal: (e) => fatal.push(e),
      },
      // The shortest session timeout: the timer heartbeats every 600 ms.
      { KAFKA_SESSION_TIMEOUT_MS: '6000' },
    );
    await runner.start();
    try {
      const failed = await rejection(
        consumer.eachBatch!({
          ...loggedBatch(JSON.stringify(toolCall(0)), log),
          heartbeat: () => {
            beats++;
            return Promise.reject(rebalancing);
          },
        }),
      );
      // Before, the timer's heartbeat swallowed the rebalance: the handler was told to go on with its next step.
      expect(runningAfterBeat).toBe(false);
      expect(failed).toBe(rebalancing);
      expect(log).toEqual([]);
      expect(fatal).toEqual([]);
    } finally {
      await runner.stop();
    }
  });
});
