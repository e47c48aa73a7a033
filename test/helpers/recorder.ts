import { createTopics } from './kafka.js';
import { toolCall } from './tool-call.js';

/**
 * The recorder service (test/fixtures/recorder-service.ts) as `startProcess` runs it: it records each event_id
 * it processes in Redis, `<prefix>:seen` and `<prefix>:deliveries`.
 */
export const RECORDER = ['--import', 'tsx', 'test/fixtures/recorder-service.ts'];

/** Tool call `i` of the recorder's tests: its own step, over seven sessions and fifty tasks. */
export const recorderEvent = (i: number) => ({
  ...toolCall(i),
  session_id: `s${i % 7}`,
  task_id: `t${i % 50}`,
});

/** The recorder's input topic of `env`, with `partitions` (createTopics's default otherwise), and its dead letters. */
export const createRecorderTopics = (env: Record<string, string>, partitions?: number) =>
  createTopics([
    { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
  ]);
