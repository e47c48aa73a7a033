import { describe, expect, it } from 'vitest';
import { createCheckpointer } from '../../src/adapters/checkpointer.js';

/*
 * The checkpoint after each batch, over a store and a log of the test's own: at most one per partition per
 * interval, written to the topic only when it moved, and never taken from a state that went meanwhile.
 */
describe('createCheckpointer', () => {
  it('throttles per partition, writes only a moved checkpoint, and ignores a lost state', async () => {
    let now = 1_000;
    let answer: bigint | null = 10n;
    const reads: number[] = [];
    const writes: [number, bigint, number][] = [];
    const checkpoint = createCheckpointer({
      store: {
        checkpoint: (partition: number) => {
          reads.push(partition);
          return Promise.resolve(answer);
        },
      },
      checkpoints: {
        write: (partition: number, offset: bigint, at?: number) => {
          writes.push([partition, offset, at ?? -1]);
          return Promise.resolve();
        },
      },
      intervalMs: 100,
      now: () => now,
    });
    await checkpoint(0, 20n, 'e');
    expect(writes).toEqual([[0, 10n, 1_000]]);
    // Within the interval: not even read, on this partition; another partition has its own interval.
    now = 1_050;
    await checkpoint(0, 30n, 'e');
    await checkpoint(1, 30n, 'e');
    expect(reads).toEqual([0, 1]);
    expect(writes).toEqual([
      [0, 10n, 1_000],
      [1, 10n, 1_050],
    ]);
    // The interval past, the same offset: read, not written again.
    now = 1_100;
    await checkpoint(0, 40n, 'e');
    expect(writes).toHaveLength(2);
    // The state went (null): nothing written nor remembered, so the next batch tries at once.
    now = 1_200;
    answer = null;
    await checkpoint(0, 50n, 'e');
    answer = 15n;
    now = 1_201;
    await checkpoint(0, 50n, 'e');
    expect(writes.at(-1)).toEqual([0, 15n, 1_201]);
  });
});
