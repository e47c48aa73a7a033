import type { TestProject } from 'vitest/node';
import { startStack } from '../../deploy/local/stack.js';

declare module 'vitest' {
  export interface ProvidedContext {
    stack: { brokers: string; redisUrl: string };
  }
}

/** Starts Kafka (KRaft) and redis-server once for the integration run, unless KAFKA_BROKERS / REDIS_URL are set. */
export default async function setup(project: TestProject) {
  const t0 = Date.now();
  const stack = await startStack({ log: (s) => process.stderr.write(`[stack] ${s}\n`) });
  process.stderr.write(
    `[stack] ready in ${Date.now() - t0} ms (kafka ${stack.brokers}, redis ${stack.redisUrl}; started: ${stack.started.join(', ') || 'none'})\n`,
  );
  project.provide('stack', { brokers: stack.brokers, redisUrl: stack.redisUrl });
  return async () => {
    await stack.stop();
  };
}
