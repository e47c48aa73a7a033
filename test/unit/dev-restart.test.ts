import { describe, expect, it } from 'vitest';
import { RESTART, restartDelay } from '../../cli/dev.js';

describe('paver dev restart backoff', () => {
  it('doubles from 1 s per failure in a row and caps at 30 s', () => {
    expect([1, 2, 3, 4, 5, 6, 7, 20].map(restartDelay)).toEqual([
      1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000,
    ]);
    expect(restartDelay(0)).toBe(RESTART.initialMs);
  });
});
