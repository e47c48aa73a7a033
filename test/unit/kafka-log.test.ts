import { logLevel } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { pinoLogCreator } from '../../shared/kafka/client.js';
import type { Logger } from '../../shared/log.js';

describe('kafkajs log lines in the service log', () => {
  const capture = () => {
    const lines: [string, string][] = [];
    const at = (level: string) => (_fields: unknown, msg: string) => void lines.push([level, msg]);
    const log = {
      error: at('error'),
      warn: at('warn'),
      debug: at('debug'),
      trace: at('trace'),
    } as unknown as Logger;
    const write = pinoLogCreator(log)(logLevel.INFO);
    const entry = (level: logLevel, message: string, error?: string) =>
      write({
        namespace: 'Connection',
        level,
        label: 'ERROR',
        log: { timestamp: '', message, error, logger: 'kafkajs' },
      });
    return { lines, entry };
  };

  it('a CreateTopics answer that topic preparation decides on (services creating the same topics at once) is not an error', () => {
    const { lines, entry } = capture();
    entry(logLevel.ERROR, 'Response CreateTopics(key: 19, version: 3)', 'Topic creation errors');
    expect(lines).toEqual([['debug', 'Response CreateTopics(key: 19, version: 3)']]);
  });

  it('an answer kafkajs retries itself (a leader not elected yet at start-up) is not an error: the caller reports what the retries do not cure', () => {
    const { lines, entry } = capture();
    entry(
      logLevel.ERROR,
      'Response ListOffsets(key: 2, version: 3)',
      'This server is not the leader for that topic-partition',
    );
    entry(
      logLevel.ERROR,
      'Response Metadata(key: 3, version: 6)',
      'There is no leader for this topic-partition as we are in the middle of a leadership election',
    );
    expect(lines.map((l) => l[0])).toEqual(['debug', 'debug']);
  });

  it('every other error stays an error, warnings stay warnings', () => {
    const { lines, entry } = capture();
    entry(
      logLevel.ERROR,
      'Response Produce(key: 0, version: 7)',
      'Not authorized to access topics: [Topic authorization failed]',
    );
    entry(logLevel.ERROR, 'Response CreateTopics(key: 19, version: 3)', 'Cluster authorization failed');
    // The same words outside a broker's answer (a connection error, say) are not judged.
    entry(logLevel.ERROR, 'Connection error', 'This server is not the leader for that topic-partition');
    entry(logLevel.WARN, 'Connection timeout');
    expect(lines.map((l) => l[0])).toEqual(['error', 'error', 'error', 'warn']);
  });
});
