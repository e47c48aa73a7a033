import { KafkaJSConnectionError, KafkaJSNonRetriableError, KafkaJSProtocolError } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { classifyError, PaverError } from '../../shared/errors.js';
import { redisFailure } from '../../shared/redis/replies.js';
import { isBrokerOutage, membershipChange } from '../../shared/kafka/runner.js';

// kafkajs builds protocol errors from the broker's error table this way; its typings only declare `Error | string`.
const protocol = (type: string, code: number) =>
  new KafkaJSProtocolError({
    type,
    code,
    retriable: false,
    message: `${type} from the broker`,
  } as unknown as Error);

describe('what the runner makes of a failed batch', () => {
  it('a heartbeat or commit that finds the group rebalancing is handed back to kafkajs as it was thrown', () => {
    for (const [type, code] of [
      ['REBALANCE_IN_PROGRESS', 27],
      ['ILLEGAL_GENERATION', 22],
      ['NOT_COORDINATOR_FOR_GROUP', 16],
      ['UNKNOWN_MEMBER_ID', 25],
    ] as const) {
      const raw = protocol(type, code);
      expect(membershipChange(raw)).toBe(raw);
      // Wrapped (a cause, kafkajs's originalError): still found, and the original is what goes back.
      expect(membershipChange(new PaverError('INTERNAL', 'batch', { cause: raw }))).toBe(raw);
      expect(
        membershipChange(Object.assign(new KafkaJSNonRetriableError('retries'), { originalError: raw })),
      ).toBe(raw);
    }
  });

  it('other failures are not mistaken for a rebalance', () => {
    expect(membershipChange(protocol('UNKNOWN_TOPIC_OR_PARTITION', 3))).toBeNull();
    expect(membershipChange(new PaverError('INTERNAL', 'a bug'))).toBeNull();
    expect(membershipChange(new KafkaJSConnectionError('gone'))).toBeNull();
    expect(membershipChange('not even an error')).toBeNull();
    expect(isBrokerOutage(protocol('REBALANCE_IN_PROGRESS', 27))).toBe(false);
  });
});

describe('Redis replies that say "not now"', () => {
  const reply = (message: string) => Object.assign(new Error(message), { name: 'ReplyError' });
  it('are retriable wherever they are classified, the same list as redisFailure', () => {
    for (const m of [
      "READONLY You can't write against a read only replica.",
      'MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to no.',
      "OOM command not allowed when used memory > 'maxmemory'.",
      'NOREPLICAS Not enough good replicas to write.',
      'LOADING Redis is loading the dataset in memory',
    ]) {
      expect(classifyError(reply(m)).retriable, m).toBe(true);
      expect(redisFailure('apply', reply(m)).retriable, m).toBe(true);
    }
    expect(classifyError(reply('ERR Error running script: attempt to compare nil')).retriable).toBe(false);
    expect(redisFailure('apply', reply('WRONGTYPE Operation against a key')).retriable).toBe(false);
  });
});

describe("ioredis's command timeout (REDIS_COMMAND_TIMEOUT_MS)", () => {
  it('is a transient Redis failure wherever it is classified: the batch is retried, the service stays up', () => {
    // As ioredis rejects a command that got no reply within commandTimeout (a plain Error, no code).
    const timedOut = new Error('Command timed out');
    expect(classifyError(timedOut).code).toBe('REDIS_UNAVAILABLE');
    expect(classifyError(timedOut).retriable).toBe(true);
    expect(redisFailure('apply', timedOut).retriable).toBe(true);
    // Only that message: a bug whose text merely mentions a timeout is still a bug.
    expect(classifyError(new Error('parsing the Command timed out field')).retriable).toBe(false);
  });
});
