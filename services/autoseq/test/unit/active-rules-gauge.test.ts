import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createAutoseqMetrics } from '../../src/adapters/metrics.js';

const gauge = async (r: Registry) =>
  (await r.getSingleMetric('paver_autoseq_active_rules')!.get()).values[0]!.value;

describe('paver_autoseq_active_rules', () => {
  it('counts each scope as of its last write, and stops counting a scope once its rules have expired', async () => {
    let t = 0;
    const registry = new Registry();
    const m = createAutoseqMetrics(
      registry,
      () => 0,
      1000,
      () => t,
    );
    m.activeByScope.set('a', 3);
    m.activeByScope.set('b', 2);
    expect(await gauge(registry)).toBe(5);
    t = 600;
    m.activeByScope.set('a', 4); // a written again: its lifetime starts over
    expect(await gauge(registry)).toBe(6);
    t = 1000; // b idle for the TTL: gone from Redis, so from the gauge
    expect(await gauge(registry)).toBe(4);
    expect(m.activeByScope.size).toBe(1);
    t = 1600;
    expect(await gauge(registry)).toBe(0);
  });

  it('keeps every scope when rules never expire', async () => {
    let t = 0;
    const registry = new Registry();
    const m = createAutoseqMetrics(
      registry,
      () => 0,
      0,
      () => t,
    );
    m.activeByScope.set('a', 3);
    t = 10 ** 12;
    expect(await gauge(registry)).toBe(3);
  });

  it('counts read from Redis never replace what a batch wrote since, nor outlive a loss, and expire as written', async () => {
    let t = 10_000;
    const registry = new Registry();
    const m = createAutoseqMetrics(
      registry,
      () => 0,
      1000,
      () => t,
    );
    const read = m.activeByScope.seed();
    m.activeByScope.set('a', 1); // a batch wrote a while the read ran: its count is the newer
    m.activeByScope.delete('b'); // and b, left with no active rule
    read.set('a', 7, t);
    read.set('b', 7, t);
    read.set('c', 3, t - 400); // written 400 ms before: 600 ms of its lifetime left
    read.set('d', 0, t);
    read.end();
    expect(await gauge(registry)).toBe(4);
    t += 600;
    expect(await gauge(registry)).toBe(1);

    const before = m.activeByScope.seed();
    m.activeByScope.clear(); // a loss: what was read before it is gone with it
    before.set('e', 5, t);
    before.end();
    expect(await gauge(registry)).toBe(0);
  });
});
