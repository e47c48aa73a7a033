import { Registry } from 'prom-client';
import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1, type ToolCallsEvent } from '../../schemas/index.js';
import { jsonCodec } from '../../shared/codec.js';
import { commonEnvSchema } from '../../shared/config.js';
import { createRunner, zodParser, type RunnerOptions, type RuntimeDeps } from '../../shared/kafka/runner.js';
import { silentLogger } from '../../shared/log.js';
import { createMetrics } from '../../shared/metrics.js';

/**
 * kafkajs's consumer as the runner uses it, with no broker: for unit tests of the runner's own rules (offsets,
 * pauses, retries), which a real broker cannot be made to break on cue. The test drives `eachBatch` itself.
 */
export function standInConsumer(resume: () => void = () => undefined) {
  const listeners = new Map<string, (e: { payload: unknown }) => void>();
  const c = {
    eachBatch: null as ((p: unknown) => Promise<void>) | null,
    events: {
      GROUP_JOIN: 'join',
      CRASH: 'crash',
      REBALANCING: 'rebalancing',
      STOP: 'stop',
      END_BATCH_PROCESS: 'end',
      FETCH: 'fetch',
    },
    on: (event: string, fn: (e: { payload: unknown }) => void) => void listeners.set(event, fn),
    /** What kafkajs's instrumentation emitter does: calls the runner's listener of `event`, if any. */
    emit: (event: string, payload: unknown) => listeners.get(event)?.({ payload }),
    connect: async () => undefined,
    subscribe: async () => undefined,
    run: async (cfg: { eachBatch: (p: unknown) => Promise<void> }) => {
      c.eachBatch = cfg.eachBatch;
    },
    disconnect: async () => undefined,
    commitOffsets: async (_offsets: { topic: string; partition: number; offset: string }[]): Promise<void> =>
      undefined,
    resume,
  };
  return c;
}

/** The runner's dependencies around a stand-in consumer (`kafka`): lag polls off, outputs dropped; `env` adds variables. */
export function standInDeps(
  kafka: unknown,
  over: Partial<RuntimeDeps> = {},
  env: Record<string, string> = {},
): RuntimeDeps {
  return {
    env: commonEnvSchema.parse({
      KAFKA_BROKERS: '127.0.0.1:1',
      REDIS_URL: 'redis://127.0.0.1:1',
      PAVER_LAG_POLL_MS: '300000',
      ...env,
    }),
    kafka: kafka as RuntimeDeps['kafka'],
    codec: jsonCodec(),
    sink: { sendRaw: async () => undefined } as never,
    metrics: createMetrics('test', new Registry()),
    log: silentLogger(),
    onFatal: () => undefined,
    ...over,
  };
}

/** A stand-in `kafka` whose consumer is `consumer` and whose admin does nothing. */
export const standInKafka = (consumer: unknown) => ({
  consumer: () => consumer,
  admin: () => ({ connect: async () => undefined, disconnect: async () => undefined }),
});

/**
 * A tool-calls runner (group 'g', topic 't', a handler that does nothing) over `kafka` (standInKafka of a
 * stand-in consumer), with standInDeps's dependencies, not started: `options` replaces any part of it (the
 * handler, `ready`, `onFatal`...), `env` adds variables.
 */
export const standInRunner = (
  kafka: unknown,
  options: Partial<RunnerOptions<ToolCallsEvent>> = {},
  env: Record<string, string> = {},
) =>
  createRunner<ToolCallsEvent>({
    service: 'test',
    groupId: 'g',
    topics: ['t'],
    parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
    handler: async () => undefined,
    ...standInDeps(kafka, {}, env),
    ...options,
  });

/** One batch of one record on partition 0 of topic `t`; its partition's resume pushes 'partition' to `resumed`. */
export const oneRecordBatch = (resumed: string[]) => ({
  batch: {
    topic: 't',
    partition: 0,
    highWatermark: '1',
    messages: [{ offset: '0', key: null, value: Buffer.from('{}'), timestamp: '0', headers: {} }],
    lastOffset: () => '0',
  },
  resolveOffset: () => undefined,
  commitOffsetsIfNecessary: async () => undefined,
  heartbeat: async () => undefined,
  pause: () => () => resumed.push('partition'),
  isRunning: () => true,
  isStale: () => false,
});

/**
 * One batch of partition 0 holding `value` at offset 0, whose commits and resolved offsets are written to `log`
 * ('commit', 'resolve 0'): for tests of what the runner tells kafkajs once a batch is done, or not.
 */
export const loggedBatch = (value: string | Buffer, log: string[]) => {
  const b = oneRecordBatch([]);
  return {
    ...b,
    batch: { ...b.batch, messages: [{ ...b.batch.messages[0]!, value: Buffer.from(value) }] },
    resolveOffset: (o: string) => void log.push(`resolve ${o}`),
    commitOffsetsIfNecessary: async () => void log.push('commit'),
  };
};

/** What a promise rejected with, or null when it resolved. */
export const rejection = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e: unknown) => e,
  );

/** What a kafkajs heartbeat or commit throws while the group rebalances (another member joined or left). */
export const rebalancingError = () =>
  Object.assign(new Error('The group is rebalancing, so a rejoin is needed'), {
    name: 'KafkaJSProtocolError',
    type: 'REBALANCE_IN_PROGRESS',
    retriable: false,
  });
