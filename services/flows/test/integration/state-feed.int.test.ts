import { afterAll, describe, expect, it } from 'vitest';
import { commonEnvSchema } from '../../../../shared/config.js';
import { jsonCodec } from '../../../../shared/codec.js';
import { createLogger } from '../../../../shared/log.js';
import { createMetrics } from '../../../../shared/metrics.js';
import { createTopics, stack, testKafka, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { CandidateStates, createStateFeed, stateWriter } from '../../src/adapters/state-feed.js';
import type { StoredCandidate } from '../../src/core/promotion.js';
import { A, T, closeFixture, record, sink } from './engine-fixture.js';

afterAll(closeFixture);

/** One candidate's state, told apart by its shadow trials. */
const state = (trials: number, status: StoredCandidate['status']): StoredCandidate => ({
  record: record('k1', 10, 1),
  status,
  retracted: false,
  decided_at: status === 'pending' ? null : trials,
  shadow_trials: trials,
  shadow_proposed: 0,
  shadow_matched: 0,
});

const runtime = (ready: () => boolean) => ({
  env: commonEnvSchema.parse({
    KAFKA_BROKERS: stack().brokers,
    REDIS_URL: stack().redisUrl,
    // Under one state record: the feed is given one write per fetch, as a feed behind the writes may be.
    KAFKA_MAX_BYTES_PER_PARTITION: '1024',
  }),
  kafka: testKafka(),
  codec: jsonCodec(),
  sink,
  metrics: createMetrics('flows-test'),
  log: createLogger('flows-test', 'silent'),
  onFatal: () => undefined,
  // The feed pauses while this says no, as the service's feeds do while the schema registry is down.
  codecWatch: { ready, transientFailure: () => undefined },
});

/**
 * The service's rebuild after a Redis loss waits for the state feed (`caughtUp`), then restores the candidates'
 * states it holds (`CandidateStates`) with HSETNX: what they hold when the wait ends is what Redis gets back.
 */
async function place() {
  const topic = unique('flows-state');
  await createTopics([{ topic, partitions: 1, compacted: true }]);
  await sink.connect();
  const states = new CandidateStates();
  const gate = { up: true };
  const on: { read?: (trials: number) => void } = {};
  const feed = createStateFeed(
    states,
    { topic, groupPrefix: unique('flows-test') },
    runtime(() => gate.up),
    (_t, _a, c) => on.read?.(c.shadow_trials),
  );
  const held = () => [...states.entries()].flatMap((s) => s.candidates.map((c) => c.shadow_trials));
  return { topic, states, gate, on, feed, held };
}

describe('the candidates states a rebuild restores, once the feed read its topic at start', () => {
  it('are read to the end again: another instance’s reject the feed has not read yet is restored', async () => {
    const { topic, gate, feed, held } = await place();
    const other = stateWriter(sink, topic, new CandidateStates());
    await other(T, A, [state(1, 'pending')]);
    await feed.start();
    try {
      expect(await feed.caughtUp(60_000)).toBe(true);
      expect(held()).toEqual([1]);
      // Another instance's reject, which lands in Redis; Redis is then lost, and this feed has not read it.
      gate.up = false;
      await other(T, A, [state(2, 'rejected')]);
      const restored = feed.caughtUp(60_000).then((read) => ({ read, held: held() }));
      gate.up = true;
      expect(await restored).toEqual({ read: true, held: [2] });
    } finally {
      await feed.stop();
    }
  });

  it('never are an older record of this instance’s own, read by the feed after its newer write', async () => {
    const { topic, states, gate, on, feed, held } = await place();
    const write = stateWriter(sink, topic, states);
    await feed.start();
    try {
      expect(await feed.caughtUp(60_000)).toBe(true);
      // This instance's pending state, then its reject: taken as acknowledged, ahead of the feed.
      gate.up = false;
      await write(T, A, [state(1, 'pending')]);
      await write(T, A, [state(2, 'rejected')]);
      expect(held()).toEqual([2]);
      // A rebuild asked when the feed gives back the pending state, before it reads the reject.
      let restored: Promise<{ read: boolean; held: number[] }> | undefined;
      on.read = (trials) => {
        if (trials === 1) restored ??= feed.caughtUp(60_000).then((read) => ({ read, held: held() }));
      };
      gate.up = true;
      await waitFor(() => restored, 'the feed to read the pending state');
      expect(await restored).toEqual({ read: true, held: [2] });
    } finally {
      await feed.stop();
    }
  });
});
