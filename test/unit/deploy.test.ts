import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { SERVICES } from '../../cli/services.js';

const compose = parse(readFileSync(new URL('../../docker-compose.yml', import.meta.url), 'utf8')) as {
  services: Record<
    string,
    {
      image?: string;
      build?: string;
      command?: string[];
      environment?: Record<string, unknown>;
      depends_on?: Record<string, unknown>;
      ports?: string[];
    }
  >;
};
const prom = parse(
  readFileSync(new URL('../../deploy/prometheus/prometheus.yml', import.meta.url), 'utf8'),
) as {
  scrape_configs: { static_configs: { targets: string[] }[] }[];
};

describe('docker-compose.yml (validated here; no Docker engine to run it)', () => {
  it('has Kafka in KRaft mode, Redis, a schema registry and Prometheus', () => {
    expect(compose.services.kafka?.environment?.KAFKA_PROCESS_ROLES).toBe('broker,controller');
    expect(compose.services.kafka?.environment?.KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR).toBe(1);
    expect(compose.services.redis?.image).toMatch(/^redis:/);
    expect(compose.services['schema-registry']?.image).toMatch(/schema-registry/);
    expect(compose.services.prometheus?.image).toMatch(/^prom\/prometheus/);
  });

  it('runs every Paver service, wired to Kafka and Redis, and Prometheus scrapes each one', () => {
    const targets = prom.scrape_configs.flatMap((c) => c.static_configs.flatMap((s) => s.targets));
    for (const [name, s] of Object.entries(SERVICES)) {
      const svc = compose.services[name];
      expect(svc, name).toBeDefined();
      expect(svc?.command).toEqual(['run', name]);
      expect(svc?.environment?.KAFKA_BROKERS).toBe('kafka:9092');
      expect(String(svc?.environment?.REDIS_URL)).toMatch(/^redis:\/\/redis:/);
      expect(Object.keys(svc?.depends_on ?? {})).toEqual(expect.arrayContaining(['kafka', 'redis']));
      expect(targets).toContain(`${name}:${s.port}`);
    }
  });
});
