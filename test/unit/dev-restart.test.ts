import { describe, expect, it, vi } from 'vitest';
import { dev, RESTART, restartDelay, withoutPassword } from '../../cli/dev.js';

vi.mock('../../deploy/local/stack.js', () => ({
  startStack: () =>
    Promise.reject(new Error('java not found: the local Kafka needs Java 17 (or set KAFKA_BROKERS …)')),
}));

describe('paver dev restart backoff', () => {
  it('doubles from 1 s per failure in a row and caps at 30 s', () => {
    expect([1, 2, 3, 4, 5, 6, 7, 20].map(restartDelay)).toEqual([
      1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000,
    ]);
    expect(restartDelay(0)).toBe(RESTART.initialMs);
  });
});

describe('paver dev start-up', () => {
  it('a stack that does not start is one message on stderr and exit 1, not a stack trace', async () => {
    let err = '';
    const write = vi.spyOn(process.stderr, 'write').mockImplementation((s: string | Uint8Array) => {
      err += String(s);
      return true;
    });
    try {
      // Before: dev() rejected, and Node printed the error with its stack trace.
      expect(await dev({ services: ['detector'] })).toBe(1);
    } finally {
      write.mockRestore();
    }
    expect(err).toBe(
      'paver dev: the local stack did not start: java not found: the local Kafka needs Java 17 (or set KAFKA_BROKERS …)\n',
    );
  });
});

describe('paver dev shows REDIS_URL without its password', () => {
  it('in the user part and in the query, which ioredis reads as an option (redis://host?password=…)', () => {
    expect(withoutPassword('redis://paver:hunter2@10.0.0.5:6379/2')).toBe(
      'redis://paver:***@10.0.0.5:6379/2',
    );
    // Before: printed as given, password and all.
    expect(withoutPassword('redis://10.0.0.5:6379/2?password=hunter2&family=4')).toBe(
      'redis://10.0.0.5:6379/2?password=***&family=4',
    );
    expect(withoutPassword('redis://127.0.0.1:6379')).toBe('redis://127.0.0.1:6379');
  });
});
