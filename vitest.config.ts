import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts', 'services/*/test/unit/**/*.test.ts'],
          environment: 'node',
          globalSetup: ['test/helpers/tmp-setup.ts'],
          // Property tests run hundreds of streams; on a busy 2-core machine vitest's 5 s default fails them
          // for slowness, which is not what they test.
          testTimeout: 60_000,
        },
      },
      {
        test: {
          name: 'integration',
          include: [
            'test/integration/**/*.int.test.ts',
            'services/*/test/integration/**/*.int.test.ts',
            'test/e2e/**/*.int.test.ts',
          ],
          environment: 'node',
          // One real broker and redis-server for the whole run, started and stopped here.
          // The temporary folder first: the stack's data goes in it too, and it is removed last.
          globalSetup: ['test/helpers/tmp-setup.ts', 'test/helpers/global-setup.ts'],
          // Files share the broker on a 2-core machine: one at a time keeps rebalances and timings sane.
          fileParallelism: false,
          // Above every default inner wait (waitFor 60 s, consumeUntil 120 s): at 120 s, a consumeUntil that gave up
          // was cut short by the test's timeout first, which says neither what was awaited nor what was read.
          testTimeout: 300_000,
          hookTimeout: 180_000,
        },
      },
    ],
  },
});
