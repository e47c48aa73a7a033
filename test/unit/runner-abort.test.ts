import { describe, expect, it, vi } from 'vitest';
import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1, type ToolCallsEvent } from '../../schemas/index.js';
import { PaverError } from '../../shared/errors.js';
import type { BatchContext } from '../../shared/kafka/chunk.js';
import { createRunner, zodParser } from '../../shared/kafka/runner.js';
import {
  oneRecordBatch,
  rebalancingError,
  standInConsumer,
  standInDeps,
  standInKafka,
} from '../helpers/stand-in-consumer.js';

const message = {
  offset: '0',
  key: Buffer.from('s'),
  value: Buffer.from(
    JSON.stringify({
      type: 'tool_call',
      event_id: 'e0',
      ts: 1_700_000_000_000,
      session_id: 's',
      task_id: 't',
      step: 0,
      tool: 'search',
    }),
  ),
  timestamp: '0',
  headers: {},
};

/**
 * A handler step that waits on something slow with no end of its own (a model call that does not answer):
 * it ends only when the batch's signal tells it to, as a fetch given that signal does.
 */
const slowStep = (ctx: BatchContext, entered: () => void) =>
  new Promise<never>((_, reject) => {
    entered();
    const stop = () => reject(new PaverError('SHUTTING_DOWN', 'step stopped by the batch signal'));
    if (ctx.signal?.aborted) return stop();
    ctx.signal?.addEventListener('abort', stop);
  });

function runnerWith(
  consumer: ReturnType<typeof standInConsumer>,
  handler: (ctx: BatchContext) => Promise<void>,
) {
  const fatal: Error[] = [];
  const runner = createRunner<ToolCallsEvent>({
    service: 'test',
    groupId: 'g',
    topics: ['t'],
    parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
    handler: (_records, ctx) => handler(ctx),
    // The shortest session timeout: the timer heartbeats every 600 ms.
    ...standInDeps(
      standInKafka(consumer),
      { onFatal: (e) => fatal.push(e) },
      { KAFKA_SESSION_TIMEOUT_MS: '6000' },
    ),
  });
  return { runner, fatal };
}

describe('consumer runner: a handler step waiting on something slow', () => {
  it('is aborted when the heartbeat timer meets a rebalance: the group does not wait for it', async () => {
    const rebalancing = rebalancingError();
    const consumer = standInConsumer();
    const log: string[] = [];
    const { runner, fatal } = runnerWith(consumer, (ctx) => slowStep(ctx, () => log.push('step')));
    await runner.start();
    try {
      const failed = await consumer.eachBatch!({
        ...oneRecordBatch([]),
        batch: { ...oneRecordBatch([]).batch, messages: [message] },
        heartbeat: () => Promise.reject(rebalancing),
        commitOffsetsIfNecessary: async () => void log.push('commit'),
        resolveOffset: (o: string) => void log.push(`resolve ${o}`),
      }).then(
        () => null,
        (e: unknown) => e,
      );
      // Before, nothing told the step: it waited for good (here, until the test timed out).
      expect(failed).toBe(rebalancing);
      expect(log).toEqual(['step']);
      expect(fatal).toEqual([]);
    } finally {
      await runner.stop();
    }
  });

  it('is aborted when the service stops: the batch ends uncommitted, as stopped, not failed', async () => {
    const consumer = standInConsumer();
    const log: string[] = [];
    let entered = false;
    let running: boolean | null = null;
    const { runner, fatal } = runnerWith(consumer, async (ctx) => {
      try {
        await slowStep(ctx, () => (entered = true));
      } finally {
        running = ctx.isRunning();
      }
    });
    await runner.start();
    const batch = consumer.eachBatch!({
      ...oneRecordBatch([]),
      batch: { ...oneRecordBatch([]).batch, messages: [message] },
      // kafkajs's own flag stays up until the batch returns: the stop must reach the step by the signal.
      isRunning: () => true,
      commitOffsetsIfNecessary: async () => void log.push('commit'),
      resolveOffset: (o: string) => void log.push(`resolve ${o}`),
    }).then(
      () => null,
      (e: unknown) => e,
    );
    await vi.waitFor(() => expect(entered).toBe(true), { timeout: 10_000 });
    await runner.stop();
    // Before, the step went on past the stop (here, the batch never ended and the wait timed out).
    expect(await batch).toBe(null);
    expect(running).toBe(false);
    expect(log).toEqual([]);
    expect(fatal).toEqual([]);
  });
});
