import { Registry } from 'prom-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createMetrics } from '../../shared/metrics.js';
import {
  oneRecordBatch,
  standInConsumer,
  standInKafka,
  standInRunner,
} from '../helpers/stand-in-consumer.js';

const unhandled: unknown[] = [];
const onUnhandled = (err: unknown) => unhandled.push(err);
afterEach(() => {
  process.off('unhandledRejection', onUnhandled);
  unhandled.length = 0;
});

describe('consumer runner: consumption paused for a dependency', () => {
  it('resumes without an unhandled rejection when the consumer was stopped or is restarting meanwhile', async () => {
    process.on('unhandledRejection', onUnhandled);
    // kafkajs drops its consumer group when it stops, for a crash's restart too (a new one is made at the
    // restart); until then `consumer.resume` throws "Consumer group was not initialized".
    let groupAlive = true;
    const consumer = standInConsumer(() => {
      if (!groupAlive)
        throw Object.assign(
          new Error('Consumer group was not initialized, consumer#run must be called first'),
          {
            name: 'KafkaJSNonRetriableError',
          },
        );
    });
    let redisUp = false;
    const resumed: string[] = [];
    const runner = standInRunner(standInKafka(consumer), { ready: () => redisUp });
    await runner.start();
    try {
      // A batch while Redis is down: the partition is paused until it is back.
      await consumer.eachBatch!(oneRecordBatch(resumed));
      // The broker is lost too (a network partition takes both): kafkajs's consumer crashes and waits to restart.
      groupAlive = false;
      redisUp = true;
      await vi.waitFor(() => expect(resumed).toEqual(['partition']), { timeout: 5_000 });
      // A rejection is reported once the tasks queued with it have run.
      for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
      expect(unhandled).toEqual([]);
    } finally {
      await runner.stop();
    }
  });

  it('paver_consumer_paused stays 1 while the main consumer waits, whatever a table feed sharing the metrics does', async () => {
    // The service's table feeds (catalogs, orchestration, flows' tables) get the service's metrics and, since
    // 98ce9d5, a `ready` of their own (the schema registry). The gauge has no label: a feed that resumed wrote
    // 0 over the main consumer's 1, which still waited for Redis.
    const metrics = createMetrics('test', new Registry());
    let registryUp = false;
    const redisUp = false;
    const make = (ready: () => boolean) => {
      const consumer = standInConsumer();
      const runner = standInRunner(standInKafka(consumer), { groupId: `g${Math.random()}`, ready, metrics });
      return { consumer, runner };
    };
    const main = make(() => redisUp && registryUp);
    const feed = make(() => registryUp);
    await main.runner.start();
    await feed.runner.start();
    const gauge = async () => (await metrics.paused.get()).values[0]?.value;
    try {
      const mainResumed: string[] = [];
      const feedResumed: string[] = [];
      await main.consumer.eachBatch!(oneRecordBatch(mainResumed));
      await feed.consumer.eachBatch!(oneRecordBatch(feedResumed));
      expect(await gauge()).toBe(1);
      // The registry answers again; Redis is still down, so the main consumer still waits.
      registryUp = true;
      await vi.waitFor(() => expect(feedResumed).toEqual(['partition']), { timeout: 5_000 });
      expect(mainResumed).toEqual([]);
      expect(await gauge()).toBe(1);
    } finally {
      await main.runner.stop();
      await feed.runner.stop();
    }
  });
});
