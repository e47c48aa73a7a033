import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { toolCallsEventV1 } from '../../../../schemas/index.js';
import { createLogger } from '../../../../shared/log.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { createBatchHandler } from '../../src/adapters/batch.js';
import { createDetectorMetrics } from '../../src/adapters/metrics.js';
import { detectorGlobalKeys } from '../../src/adapters/redis/store.js';
import { connections, scope, scopeStore, threeRuns } from './scope-fixture.js';

/*
 * `paver_detector_redis_round_trips_total` took the store's tally at the end of each batch that succeeded: the
 * round trips of a batch that failed, of the sweep and of publication retries waited for the next good batch,
 * and those after the last one before a stop were never counted. Now the counter reads the tally whenever the
 * registry is read.
 */

const { redis, sink } = connections();

async function setup() {
  const { prefix, store, publisher } = await scopeStore({ redis, sink }, 'det-trips');
  const registry = new Registry();
  const m = createDetectorMetrics(registry, store);
  const counted = async () =>
    (await registry.getSingleMetric('paver_detector_redis_round_trips_total')!.get()).values[0]?.value ?? 0;
  return { prefix, store, publisher: publisher(), m, counted };
}

describe('detector: every Redis round trip is counted when it is made', () => {
  it('a sweep’s, with no batch after it', async () => {
    const { store, publisher, counted } = await setup();
    await store.applyBatch(threeRuns());
    await publisher.publish(scope, true);
    await publisher.sweep();
    expect(store.roundTrips).toBeGreaterThan(4);
    expect(await counted()).toBe(store.roundTrips);
    // Read again with nothing new: nothing counted twice.
    expect(await counted()).toBe(store.roundTrips);
    await publisher.close();
  });

  it('a batch’s whose publication failed', async () => {
    const { prefix, store, m, counted } = await setup();
    await redis.set(detectorGlobalKeys(prefix).epoch, 'e');
    const handler = createBatchHandler({
      store,
      rebuilder: {
        ensure: () => Promise.resolve({ epoch: 'e', changed: [] }),
        invalidate: () => undefined,
        exclusive: (_p, fn) => fn(),
        noteApplied: () => undefined,
      },
      // The producer down: the chunk fails after its apply.
      publisher: { publish: () => Promise.reject(new Error('broker down')) },
      checkpoint: () => Promise.resolve(),
      requestTerms: true,
      maxAheadMs: Number.MAX_SAFE_INTEGER,
      metrics: m,
      log: createLogger('test', 'silent'),
    });
    const events = [...agentEvents({ tasks: 3, seed: 1 })];
    const batch = events.map((value, i) => ({
      topic: 'tool-calls',
      partition: 0,
      offset: String(i),
      key: value.session_id,
      timestamp: String(value.ts),
      value: toolCallsEventV1.parse(value),
    }));
    await expect(
      handler(batch, { heartbeat: () => Promise.resolve(), isRunning: () => true }),
    ).rejects.toThrow('broker down');
    expect(store.roundTrips).toBeGreaterThan(0);
    expect(await counted()).toBe(store.roundTrips);
  });
});
