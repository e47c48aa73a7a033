/**
 * `npm run bench`: each service against a bare kafkajs consumer reading the same topic, in the same run, on a
 * local stack. Writes bench/results/<service>.json. Figures, not assertions.
 * BENCH_ONLY=detector,autoseq runs a subset; BENCH_EVENTS overrides the event counts.
 */
import { startStack } from '../deploy/local/stack.js';
import { benchAutoseq } from './autoseq.js';
import { benchDetector } from './detector.js';
import { benchSequencer } from './sequencer.js';
import { benchFlows } from './flows.js';
import { benchValidate } from './validate.js';
import { benchContext, say } from './harness.js';

const only = (process.env.BENCH_ONLY ?? '').split(',').filter(Boolean);
const events = (dflt: number) => Number(process.env.BENCH_EVENTS ?? dflt);
const SCENARIOS: Record<string, (b: Awaited<ReturnType<typeof benchContext>>) => Promise<void>> = {
  detector: (b) => benchDetector(b, events(200_000)),
  autoseq: (b) => benchAutoseq(b, events(100_000)),
  sequencer: (b) => benchSequencer(b, events(300_000), 100_000),
  flows: () => benchFlows(10_000, 5_000),
  validate: async () => benchValidate(50_000),
};

const stack = await startStack({ log: say });
const b = await benchContext(stack);
try {
  for (const [name, scenario] of Object.entries(SCENARIOS)) {
    if (only.length && !only.includes(name)) continue;
    say(`— ${name}`);
    await scenario(b);
  }
} finally {
  await b.producer.disconnect();
  b.redis.disconnect();
  await stack.stop();
}
