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
});
