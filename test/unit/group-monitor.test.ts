import { Registry } from 'prom-client';
import { describe, expect, it, vi } from 'vitest';
import { commonEnvSchema } from '../../shared/config.js';
import { createGroupMonitor } from '../../shared/kafka/group-monitor.js';
import { silentLogger } from '../../shared/log.js';
import { createMetrics } from '../../shared/metrics.js';

/** An admin whose committed-offsets answer the test releases: a poll is then in flight exactly as long as wanted. */
function slowAdmin(committed: () => string) {
  let release: () => void = () => undefined;
  let asked: () => void = () => undefined;
  const askedP = new Promise<void>((r) => (asked = r));
  const gate = new Promise<void>((r) => (release = r));
  const admin = {
    connect: async () => undefined,
    disconnect: async () => undefined,
    describeGroups: async () => ({
      groups: [{ groupId: 'g', state: 'Stable', members: [{ memberId: 'm' }] }],
    }),
    fetchTopicOffsets: async () => [{ partition: 0, offset: '27', high: '27', low: '0' }],
    fetchOffsets: async () => {
      const answer = committed();
      asked();
      await gate;
      return [{ topic: 't', partitions: [{ partition: 0, offset: answer, metadata: null }] }];
    },
  };
  return { admin, askedP, release };
}

/** A monitor of group 'g', member 'm', over topic 't', polling through `admin`. */
function monitorOf(
  metrics: ReturnType<typeof createMetrics>,
  admin: unknown,
  assignment: () => Record<string, number[]>,
  env: Record<string, string> = {},
) {
  return createGroupMonitor({
    groupId: 'g',
    topics: ['t'],
    env: commonEnvSchema.parse({ KAFKA_BROKERS: '127.0.0.1:1', REDIS_URL: 'redis://127.0.0.1:1', ...env }),
    log: silentLogger(),
    metrics,
    memberId: () => 'm',
    assignment,
    admin: () => admin as never,
  });
}

async function lagOf(registry: Registry): Promise<number | undefined> {
  const m = (await registry.getMetricsAsJSON()).find((x) => x.name === 'paver_consumer_lag');
  return m?.values.find((v) => v.labels.partition === '0')?.value;
}

describe('group monitor', () => {
  it('a poll answered after the runner reported keeps the runner’s fresher lag', async () => {
    const registry = new Registry();
    const metrics = createMetrics('test', registry);
    let committedNow = '-1';
    const slow = slowAdmin(() => committedNow);
    const monitor = monitorOf(metrics, slow.admin, () => ({ t: [0] }));
    monitor.poke();
    // The poll read "nothing committed"; meanwhile the runner processes all 27, commits and reports lag 0.
    await slow.askedP;
    committedNow = '27';
    metrics.consumerLag.set({ topic: 't', partition: '0' }, 0);
    monitor.processed('t', 0, 27n, 27n);
    slow.release();
    await monitor.stop();
    expect(await lagOf(registry)).toBe(0);
  });
});

describe('group monitor: pokes', () => {
  it('a poke that finds a poll in flight polls again once it is done, not an interval later', async () => {
    const registry = new Registry();
    const metrics = createMetrics('test', registry);
    const slow = slowAdmin(() => '27');
    let polls = 0;
    const admin = { ...slow.admin, describeGroups: async () => (polls++, slow.admin.describeGroups()) };
    const monitor = monitorOf(metrics, admin, () => ({ t: [0] }), {
      // An interval no test waits for: only pokes poll here.
      PAVER_LAG_POLL_MS: '300000',
    });
    monitor.poke();
    await slow.askedP;
    // A join while the poll is in flight.
    monitor.poke();
    slow.release();
    await vi.waitFor(() => expect(polls).toBe(2));
    await monitor.stop();
  });
});

describe('group monitor: partitions that moved away', () => {
  it('drops the figures of a partition the runner reported but no poll saw once it is no longer assigned', async () => {
    const registry = new Registry();
    const metrics = createMetrics('test', registry);
    let gate: Promise<void> = Promise.resolve();
    let release: () => void = () => undefined;
    let polls = 0;
    const admin = {
      connect: async () => undefined,
      disconnect: async () => undefined,
      describeGroups: async () => ({
        groups: [{ groupId: 'g', state: 'Stable', members: [{ memberId: 'm' }] }],
      }),
      fetchTopicOffsets: async () => [0, 1].map((partition) => ({ partition, high: '20', low: '0' })),
      fetchOffsets: async () => {
        await gate;
        polls++;
        return [{ topic: 't', partitions: [0, 1].map((partition) => ({ partition, offset: '20' })) }];
      },
    };
    let assignment: Record<string, number[]> = { t: [0] };
    const monitor = monitorOf(metrics, admin, () => assignment);
    const series = async () =>
      (await registry.getMetricsAsJSON())
        .filter(
          (x) =>
            x.name === 'paver_consumer_lag' || x.name === 'paver_consumer_oldest_unprocessed_age_seconds',
        )
        .flatMap((x) => x.values.map((v) => `${x.name}{${String(v.labels.partition)}}`))
        .sort();
    const pollDone = async (n: number) => {
      for (let i = 0; i < 1000 && polls < n; i++) await new Promise((r) => setImmediate(r));
      expect(polls).toBe(n);
    };
    // A poll is in flight (over the old assignment) when a rebalance gives this member partition 1: the join's
    // poke finds a poll running and waits for it; the runner processes partition 1 and reports its figures.
    gate = new Promise<void>((r) => (release = r));
    monitor.poke();
    await new Promise((r) => setImmediate(r));
    assignment = { t: [0, 1] };
    monitor.poke();
    metrics.consumerLag.set({ topic: 't', partition: '1' }, 7);
    monitor.processed('t', 1, 13n, 20n);
    // Another rebalance takes partition 1 away before the next poll: no poll ever saw it here.
    assignment = { t: [0] };
    monitor.poke();
    release();
    await pollDone(2);
    await monitor.stop();
    // Before: partition 1's lag (7) and age stayed exported by this member for good, counted twice in a sum.
    expect(await series()).toEqual([
      'paver_consumer_lag{0}',
      'paver_consumer_oldest_unprocessed_age_seconds{0}',
    ]);
  });
});
