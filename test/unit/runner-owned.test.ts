import { describe, expect, it } from 'vitest';
import { standInConsumer, standInKafka, standInRunner } from '../helpers/stand-in-consumer.js';

/*
 * Work a service does on its partitions outside a batch (the detector's rebuild of a partition with no traffic)
 * must stop once they may have moved: `owned()` gives the assignment only while this member is in its group.
 * `assignment()` keeps the last join's through a rebalance, for the lag metrics.
 */
describe('consumer runner: the partitions this member owns now', () => {
  it('is the assignment from a join until a rebalance starts, a crash or a stop; null meanwhile', async () => {
    const consumer = standInConsumer();
    const rebalances: (Record<string, number[]> | null)[] = [];
    let runner: ReturnType<typeof standInRunner> | null = null;
    runner = standInRunner(standInKafka(consumer), { onRebalance: () => rebalances.push(runner!.owned()) });
    await runner.start();
    try {
      expect(runner.owned()).toBeNull();
      consumer.emit(consumer.events.GROUP_JOIN, { memberId: 'm1', memberAssignment: { t: [0, 2] } });
      expect(runner.owned()).toEqual({ t: [0, 2] });
      consumer.emit(consumer.events.REBALANCING, {});
      expect(runner.owned()).toBeNull();
      expect(runner.assignment()).toEqual({ t: [0, 2] });
      consumer.emit(consumer.events.GROUP_JOIN, { memberId: 'm1', memberAssignment: { t: [1] } });
      expect(runner.owned()).toEqual({ t: [1] });
      // The service's rebalance hook reads it: the new assignment at a join, null when a rebalance starts.
      expect(rebalances).toEqual([{ t: [0, 2] }, null, { t: [1] }]);
      consumer.emit(consumer.events.CRASH, { error: new Error('broker gone'), restart: true });
      expect(runner.owned()).toBeNull();
      consumer.emit(consumer.events.GROUP_JOIN, { memberId: 'm2', memberAssignment: { t: [1] } });
      consumer.emit(consumer.events.STOP, {});
      expect(runner.owned()).toBeNull();
    } finally {
      await runner.stop();
    }
  });
});
