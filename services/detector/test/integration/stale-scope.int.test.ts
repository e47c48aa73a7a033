import { afterAll, describe, expect, it } from 'vitest';
import { testRedis, waitFor } from '../../../../test/helpers/kafka.js';
import { serviceEnv, type Proc } from '../../../../test/helpers/process.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { detectorGlobalKeys, detectorKeys } from '../../src/adapters/redis/store.js';
import { detectorTopics, metrics, PARAMS, sendEvents, startDetector } from './backlog.js';

/**
 * A scope left in an earlier epoch that no rebuild reached: the epoch ended without a loss (an older layout met,
 * an evicted marker) and the tool-calls topic no longer held the scope's events, so no replay brought it under the
 * new one. Its next batch, on a partition already rebuilt in this epoch, was refused as another epoch's state five
 * times over, the process gave up (REDIS_UNAVAILABLE) and the partition stalled for good. Now the scope is cleared,
 * as the rebuild would have cleared it, and the batch applied.
 */
const redis = testRedis();
const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  redis.disconnect();
});

describe('detector meeting a scope of an earlier epoch (real Kafka, real Redis)', () => {
  it('clears it and applies the batch, instead of stalling the partition', async () => {
    const env = serviceEnv({ ...PARAMS, DETECTOR_CHECKPOINT_INTERVAL_MS: '0' });
    await detectorTopics(env, 1);
    const send = (evs: { session_id: string }[]) => sendEvents(env, evs);
    const applied = async (p: Proc) => {
      const m = await metrics(p);
      return (
        m.value('paver_detector_events_total', { outcome: 'applied' }) +
        m.value('paver_detector_events_total', { outcome: 'ignored' })
      );
    };
    const first = [...agentEvents({ tasks: 10, seed: 3 })];
    await send(first);
    const p = await startDetector(env, procs);
    await waitFor(async () => (await applied(p)) >= first.length, 'the first events applied');

    // What an earlier epoch left of a scope: its meta (the current parameters), under an epoch that has ended.
    const prefix = env.REDIS_KEY_PREFIX!;
    const epoch = await redis.get(detectorGlobalKeys(prefix).epoch);
    expect(epoch).not.toBeNull();
    const [meta] = (await redis.keys(`${prefix}:det:*:meta`)) as [string];
    const cfg = (await redis.hget(meta, 'cfg'))!;
    const scope = { tenant: 'stale-tenant', agent: 'stale-agent' };
    const stale = detectorKeys(prefix, scope);
    await redis.hset(stale.meta, 'cfg', cfg, 'epoch', 'an-earlier-epoch', 'maxTs', '1', 'clock:0', '1');

    const later = [...agentEvents({ tasks: 4, seed: 5 })].map((e) => ({
      ...e,
      tenant_id: scope.tenant,
      agent_id: scope.agent,
    }));
    await send(later);
    await waitFor(
      async () => (await applied(p)) >= first.length + later.length,
      "the stale scope's events applied",
    ).catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output().slice(-3000)}`);
    });
    expect(await redis.hget(stale.meta, 'epoch')).toBe(epoch);
    // Applied to it: its newest ts is the newest of its events.
    expect(Number(await redis.hget(stale.meta, 'maxTs'))).toBe(Math.max(...later.map((e) => e.ts)));
    expect(p.output()).toContain('no rebuild reached');
    expect(p.child.exitCode).toBeNull();
  }, 300_000);
});
