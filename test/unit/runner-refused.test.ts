import { KafkaJSNonRetriableError, KafkaJSProtocolError } from 'kafkajs';

import { describe, expect, it } from 'vitest';
import { jsonCodec } from '../../shared/codec.js';
import { PaverError } from '../../shared/errors.js';
import { createSink } from '../../shared/kafka/sink.js';
import {
  loggedBatch,
  rejection,
  standInConsumer,
  standInKafka,
  standInRunner,
} from '../helpers/stand-in-consumer.js';
import { toolCall } from '../helpers/tool-call.js';

// As kafkajs builds a broker's error from its table (retriable: false for these); its typings say `Error | string`.
const refusal = (type: string, code: number, message: string) =>
  new KafkaJSProtocolError({ type, code, retriable: false, message } as unknown as Error);
const topicRefused = () =>
  refusal('TOPIC_AUTHORIZATION_FAILED', 29, 'Not authorized to access topics: [Topic authorization failed]');
/** kafkajs's retrier's wrapping of a non-retriable error (`new KafkaJSNonRetriableError(e, { cause: e })`). */
const wrapped = (e: Error) =>
  Object.assign(new KafkaJSNonRetriableError(e), { cause: e }) as KafkaJSNonRetriableError;
const clusterRefused = () => refusal('CLUSTER_AUTHORIZATION_FAILED', 31, 'Cluster authorization failed');

/** One batch of partition 0 holding one record no service can read (so it goes to the dead-letter topic). */
const badRecordBatch = (log: string[]) => loggedBatch('not json', log);

/**
 * A started runner over a stand-in consumer whose dead-letter writes go to `sendRaw`, with short waits and many
 * attempts (before, every one of them was spent on a refusal, then kafkajs's restarts); `fatal` collects what
 * it reports as fatal.
 */
async function runnerWritingDeadLettersTo(sendRaw: () => Promise<void>) {
  const consumer = standInConsumer();
  const fatal: Error[] = [];
  const runner = standInRunner(
    standInKafka(consumer),
    { onFatal: (e) => fatal.push(e), sink: { sendRaw } as never },
    { PAVER_RETRY_ATTEMPTS: '4', PAVER_RETRY_INITIAL_MS: '1', PAVER_RETRY_MAX_MS: '1' },
  );
  await runner.start();
  return { consumer, runner, fatal };
}

describe('consumer runner: a dead-letter write the broker refuses for good', () => {
  for (const [name, thrown] of [
    // What kafkajs's producer throws: its retrier wraps a non-retriable error, or bails with it as it came.
    ['TOPIC_AUTHORIZATION_FAILED, wrapped by the retrier', () => wrapped(topicRefused())],
    ['CLUSTER_AUTHORIZATION_FAILED, as the broker sent it', clusterRefused],
  ] as const) {
    it(`is not retried: the service stops at once, naming the topic and the cause (${name})`, async () => {
      let writes = 0;
      const { consumer, runner, fatal } = await runnerWritingDeadLettersTo(async () => {
        writes++;
        throw thrown();
      });
      const log: string[] = [];
      try {
        const failed = await rejection(consumer.eachBatch!(badRecordBatch(log)));
        expect(writes).toBe(1);
        // Nothing committed or resolved: the record is read again once the permission is fixed.
        expect(log).toEqual([]);
        expect(failed).toBeInstanceOf(PaverError);
        expect((failed as PaverError).retriable).toBe(false);
        expect(fatal).toHaveLength(1);
        const e = fatal[0] as PaverError;
        expect(e.code).toBe('CONFIG_INVALID');
        expect(e.message).toContain('paver.dead-letters.v1');
        expect(e.message).toMatch(/(TOPIC|CLUSTER)_AUTHORIZATION_FAILED/);
        expect(e.message).toMatch(/permission|ACL/i);
      } finally {
        await runner.stop();
      }
    });
  }

  it('a dead-letter write that fails for a while (the broker away) is still retried', async () => {
    let writes = 0;
    const { consumer, runner, fatal } = await runnerWritingDeadLettersTo(async () => {
      if (writes++ < 2)
        throw Object.assign(new Error('Connection timeout'), {
          name: 'KafkaJSConnectionError',
          retriable: true,
        });
    });
    const log: string[] = [];
    try {
      await consumer.eachBatch!(badRecordBatch(log));
      expect(writes).toBe(3);
      expect(log).toEqual(['commit', 'resolve 0']);
      expect(fatal).toEqual([]);
    } finally {
      await runner.stop();
    }
  });
});

describe('sink: an output write the broker refuses for good', () => {
  /** A kafkajs stand-in whose producer's every send throws `err`. */
  const refusingKafka = (err: () => Error, sends: { n: number }) => ({
    producer: () => ({
      events: { CONNECT: 'connect', DISCONNECT: 'disconnect' },
      on: () => undefined,
      send: async () => {
        sends.n++;
        throw err();
      },
    }),
  });

  it('fails as a configuration error naming the topic and the cause, which the runner does not retry', async () => {
    const sends = { n: 0 };
    const sink = createSink(refusingKafka(() => wrapped(topicRefused()), sends) as never, jsonCodec());
    const record = toolCall(1);
    const out = await rejection(sink.send('paver.out.v1', 'tool-calls.v1', [{ key: 's', value: record }]));
    expect(out).toBeInstanceOf(PaverError);
    expect((out as PaverError).code).toBe('CONFIG_INVALID');
    expect((out as PaverError).message).toContain('paver.out.v1');
    expect((out as PaverError).message).toContain('TOPIC_AUTHORIZATION_FAILED');
    const raw = await rejection(sink.sendRaw('paver.state.v1', [{ key: 'k', value: 'v' }]));
    expect((raw as PaverError).code).toBe('CONFIG_INVALID');
    expect((raw as PaverError).message).toContain('paver.state.v1');
    expect(sends.n).toBe(2);
  });
});
