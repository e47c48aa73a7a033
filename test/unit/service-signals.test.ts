import { describe, expect, it } from 'vitest';
import { commonEnvSchema } from '../../shared/config.js';
import { runService, type ServiceSpec } from '../../shared/service.js';

/**
 * A service that never gets past start-up: nothing listens at the broker's or Redis's address, so the test
 * needs no server. The stop does not wait for start-up, so a signal ends it all the same.
 */
const spec: ServiceSpec<ReturnType<typeof commonEnvSchema.parse>, unknown> = {
  name: 'signals-test',
  envSchema: commonEnvSchema,
  defaultPort: 0,
  groupId: () => 'signals-test',
  setup: () => Promise.reject(new Error('never reached: the broker is unreachable')),
};

const env = {
  KAFKA_BROKERS: '127.0.0.1:1',
  REDIS_URL: 'redis://127.0.0.1:1',
  HTTP_PORT: '0',
  HTTP_HOST: '127.0.0.1',
  LOG_LEVEL: 'silent',
  PAVER_SHUTDOWN_TIMEOUT_MS: '20000',
};

describe('runService and stop signals', () => {
  it('25 services in one process: one listener per signal while they run, none of theirs after; a SIGTERM stops them all', async () => {
    const before = { SIGTERM: process.listeners('SIGTERM'), SIGINT: process.listeners('SIGINT') };
    const warnings: Error[] = [];
    const onWarning = (w: Error) => void warnings.push(w);
    process.on('warning', onWarning);
    try {
      const runs = Array.from({ length: 25 }, () => runService(spec, env));
      // Each service listened per signal on its own: 25 of each, past Node's limit of ten.
      expect(process.listenerCount('SIGTERM')).toBe(before.SIGTERM.length + 1);
      expect(process.listenerCount('SIGINT')).toBe(before.SIGINT.length + 1);
      // Called directly rather than emitted: vitest's own listeners, if any, must not hear it.
      const added = process.listeners('SIGTERM').filter((l) => !before.SIGTERM.includes(l));
      for (const l of added) (l as (sig: NodeJS.Signals) => void)('SIGTERM');
      expect(await Promise.all(runs)).toEqual(Array.from({ length: 25 }, () => 0));
      expect(process.listeners('SIGTERM')).toEqual(before.SIGTERM);
      expect(process.listeners('SIGINT')).toEqual(before.SIGINT);
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});
