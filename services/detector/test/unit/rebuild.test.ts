import { describe, expect, it } from 'vitest';
import { createLogger } from '../../../../shared/log.js';
import type { Epoch } from '../../../../shared/redis/epoch.js';
import { Rebuilder } from '../../src/adapters/rebuild.js';
import type { CheckpointLog } from '../../src/adapters/kafka/checkpoints.js';
import type { RedisDetectorStore } from '../../src/adapters/redis/store.js';
import type { Scope } from '../../src/core/ops.js';

/*
 * The Rebuilder's order of steps over a store of its own (what each Redis step answers is the test's to say):
 * the scopes the publication restore touched are published by the chunk whose rebuild succeeds, whatever failed
 * between the restore and the mark the first time.
 */
describe('Rebuilder: the publication restore and the mark', () => {
  it('a mark that failed after the restore: the next attempt returns the restored scopes to publish', async () => {
    const stale: Scope = { tenant: 'default', agent: 'agent-0' };
    const marks: string[] = [];
    let markFails = 1;
    let restores = 0;
    const store = {
      forgetScopes: () => undefined,
      applyBatch: () => Promise.resolve({ lost: false, changed: [] }),
      rebuiltIn: () => Promise.resolve(marks.at(-1) ?? null),
      markRebuilt: (_p: number, epoch: string) => {
        // Redis failing for a moment (a failover, a restart: when rebuilds run).
        if (markFails-- > 0) return Promise.reject(new Error('Connection is closed.'));
        marks.push(epoch);
        return Promise.resolve();
      },
    } as unknown as RedisDetectorStore;
    const epoch: Epoch = {
      key: 'p:det:epoch',
      current: () => 'e1',
      check: () => Promise.resolve({ lost: false, epoch: 'e1' }),
    };
    const rebuilder = new Rebuilder({
      store,
      epoch,
      checkpoints: { get: () => Promise.resolve(0n) } as unknown as CheckpointLog,
      replay: () => Promise.resolve(),
      restorePublished: () => {
        restores++;
        return Promise.resolve([stale]);
      },
      log: createLogger('detector-test', 'silent'),
      hooks: { started: () => undefined, finished: () => undefined },
    });
    const ctx = { heartbeat: () => Promise.resolve(), isRunning: () => true };

    await expect(rebuilder.ensure(0, 10n, [], ctx)).rejects.toThrow('Connection is closed.');
    expect(marks).toEqual([]);
    // The chunk is retried: the partition is rebuilt again, and the stale candidate's scope is published with it.
    const r = await rebuilder.ensure(0, 10n, [], ctx);
    expect(r).toEqual({ epoch: 'e1', changed: [stale] });
    expect(marks).toEqual(['e1']);
    expect(restores).toBeGreaterThanOrEqual(1);
    // Marked: later chunks trust it, and have nothing more of the restore to publish.
    expect(await rebuilder.ensure(0, 20n, [], ctx)).toEqual({ epoch: 'e1', changed: [] });
  });
});
