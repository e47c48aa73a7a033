import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';

const gauge = async (r: Registry) =>
  (await r.getSingleMetric('paver_autoseq_active_rules')!.get()).values[0]!.value;

/** The metrics on a fresh registry, with a clock the test moves (`clock.t`, ms); `ttlMs`: the scope TTL. */
function metricsAt(t: number, ttlMs: number) {
  const clock = { t };
  const registry = new Registry();
  const m = createAutoseqMetrics(
    registry,
    () => 0,
    ttlMs,
    () => clock.t,
  );
  return { clock, registry, m };
}

describe('paver_autoseq_active_rules', () => {
  it('counts each scope as of its last write, and stops counting a scope once its rules have expired', async () => {
    const { clock, registry, m } = metricsAt(0, 1000);
    m.activeByScope.set('a', 3);
    m.activeByScope.set('b', 2);
    expect(await gauge(registry)).toBe(5);
    clock.t = 600;
    m.activeByScope.set('a', 4); // a written again: its lifetime starts over
    expect(await gauge(registry)).toBe(6);
    clock.t = 1000; // b idle for the TTL: gone from Redis, so from the gauge
    expect(await gauge(registry)).toBe(4);
    expect(m.activeByScope.size).toBe(1);
    clock.t = 1600;
    expect(await gauge(registry)).toBe(0);
  });

  it('keeps every scope when rules never expire', async () => {
    const { clock, registry, m } = metricsAt(0, 0);
    m.activeByScope.set('a', 3);
    clock.t = 10 ** 12;
    expect(await gauge(registry)).toBe(3);
  });

  it('counts read from Redis never replace what a batch wrote since, nor outlive a loss, and expire as written', async () => {
    const { clock, registry, m } = metricsAt(10_000, 1000);
    const read = m.activeByScope.seed();
    m.activeByScope.set('a', 1); // a batch wrote a while the read ran: its count is the newer
    m.activeByScope.delete('b'); // and b, left with no active rule
    read.set('a', 7, clock.t);
    read.set('b', 7, clock.t);
    read.set('c', 3, clock.t - 400); // written 400 ms before: 600 ms of its lifetime left
    read.set('d', 0, clock.t);
    read.end();
    expect(await gauge(registry)).toBe(4);
    clock.t += 600;
    expect(await gauge(registry)).toBe(1);

    const before = m.activeByScope.seed();
    m.activeByScope.clear(); // a loss: what was read before it is gone with it
    before.set('e', 5, clock.t);
    before.end();
    expect(await gauge(registry)).toBe(0);
  });
});
