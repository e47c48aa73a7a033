import { describe, expect, it, vi } from 'vitest';
import { PaverError } from '../../shared/errors.js';
import type { BatchContext } from '../../shared/kafka/chunk.js';
import {
  loggedBatch,
  rebalancingError,
  rejection,
  standInConsumer,
  standInKafka,
  standInRunner,
} from '../helpers/stand-in-consumer.js';
import { toolCall } from '../helpers/tool-call.js';

/** A batch of one valid tool call, whose commits and resolved offsets go to `log`. */
const toolCallBatch = (log: string[]) => loggedBatch(JSON.stringify(toolCall(0)), log);

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
  const runner = standInRunner(
    standInKafka(consumer),
    { handler: (_records, ctx) => handler(ctx), onFatal: (e) => fatal.push(e) },
    // The shortest session timeout: the timer heartbeats every 600 ms.
    { KAFKA_SESSION_TIMEOUT_MS: '6000' },
  );
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
      const failed = await rejection(
        consumer.eachBatch!({ ...toolCallBatch(log), heartbeat: () => Promise.reject(rebalancing) }),
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
    const batch = rejection(
      consumer.eachBatch!({
        ...toolCallBatch(log),
        // kafkajs's own flag stays up until the batch returns: the stop must reach the step by the signal.
        isRunning: () => true,
      }),
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
