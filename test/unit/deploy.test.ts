import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { SERVICES } from '../../cli/services.js';
import { parseEnv } from '../../shared/config.js';

interface ComposeService {
  image?: string;
  build?: string | { context: string };
  command?: string[];
  environment?: Record<string, unknown>;
  depends_on?: Record<string, unknown> | string[];
  ports?: string[];
  volumes?: string[];
  healthcheck?: { test: string[] };
}
const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
// `merge: true`: the Paver services share their image and dependencies through a YAML anchor (<<: *paver).
const compose = parse(read('docker-compose.yml'), { merge: true }) as {
  services: Record<string, ComposeService>;
  volumes?: Record<string, unknown>;
};
const prom = parse(read('deploy/prometheus/prometheus.yml')) as {
  scrape_configs: {
    honor_labels?: boolean;
    static_configs: { targets: string[]; labels?: Record<string, string> }[];
  }[];
};
const kafka = compose.services.kafka!;
const kenv = kafka.environment ?? {};

const dockerCompose = (() => {
  try {
    execFileSync('docker', ['compose', 'version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

describe('docker-compose.yml', () => {
  it.skipIf(!dockerCompose)('validates with `docker compose config`', () => {
    execFileSync('docker', ['compose', '-f', 'docker-compose.yml', 'config', '--quiet'], {
      cwd: new URL('../..', import.meta.url),
      stdio: 'pipe',
    });
  });

  it('has Kafka in KRaft mode, Redis, a schema registry, Prometheus and Grafana', () => {
    expect(kenv.KAFKA_PROCESS_ROLES).toBe('broker,controller');
    expect(kenv.KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR).toBe(1);
    expect(compose.services.redis?.image).toMatch(/^redis:/);
    expect(compose.services['schema-registry']?.image).toMatch(/schema-registry/);
    expect(compose.services.prometheus?.image).toMatch(/^prom\/prometheus/);
    expect(compose.services.grafana?.image).toMatch(/^grafana\/grafana:\d/);
  });

  it('Kafka advertises an external listener on localhost:19092, published to the host', () => {
    const listeners = String(kenv.KAFKA_LISTENERS).split(',');
    const advertised = String(kenv.KAFKA_ADVERTISED_LISTENERS).split(',');
    const external = advertised.find((l) => l.endsWith('//localhost:19092'));
    expect(external, String(kenv.KAFKA_ADVERTISED_LISTENERS)).toBeDefined();
    const name = external!.split(':')[0]!;
    expect(listeners).toContain(`${name}://:19092`);
    // Every listener name must have a security protocol, and containers keep the internal one.
    const protocols = String(kenv.KAFKA_LISTENER_SECURITY_PROTOCOL_MAP).split(',');
    for (const l of listeners) expect(protocols.map((p) => p.split(':')[0])).toContain(l.split(':')[0]);
    expect(advertised).toContain('PLAINTEXT://kafka:9092');
    expect(kenv.KAFKA_INTER_BROKER_LISTENER_NAME).toBe('PLAINTEXT');
    expect(kafka.ports).toContain('19092:19092');
  });

  it('runs the same Kafka release as the local stack', () => {
    const pom = /<kafka\.version>([^<]+)<\/kafka\.version>/.exec(read('deploy/local/kafka/pom.xml'))?.[1];
    expect(pom).toMatch(/^\d+\.\d+\.\d+$/);
    expect(kafka.image).toBe(`apache/kafka:${pom}`);
  });

  it('keeps Redis data in an append-only file on a volume', () => {
    const cmd = compose.services.redis?.command ?? [];
    expect(cmd[cmd.indexOf('--appendonly') + 1]).toBe('yes');
    const vol = compose.services.redis?.volumes?.find((v) => v.endsWith(':/data'));
    expect(vol).toBeDefined();
    expect(Object.keys(compose.volumes ?? {})).toContain(vol!.split(':')[0]);
  });

  it('gives every infrastructure service a healthcheck (the schema registry too)', () => {
    for (const name of ['kafka', 'redis', 'schema-registry']) {
      expect(compose.services[name]?.healthcheck?.test.length, name).toBeGreaterThan(0);
    }
  });

  it('builds one image and every Paver service reuses it', () => {
    const builders = Object.entries(compose.services).filter(([, s]) => s.build !== undefined);
    expect(builders.map(([n]) => n)).toHaveLength(1);
    const image = builders[0]![1].image;
    expect(image).toMatch(/^paver:/);
    for (const name of Object.keys(SERVICES)) expect(compose.services[name]?.image, name).toBe(image);
  });

  it("Prometheus keeps the services' own service label: a target label of that name is honoured, not doubled", () => {
    // shared/metrics.ts labels every series with `service`; a scrape config that sets the same label on its
    // targets without honor_labels renames each series' own to exported_service.
    for (const c of prom.scrape_configs)
      if (c.static_configs.some((s) => s.labels && 'service' in s.labels)) expect(c.honor_labels).toBe(true);
  });

  it('runs every Paver service, wired to Kafka and Redis, and Prometheus scrapes each one', () => {
    const targets = prom.scrape_configs.flatMap((c) => c.static_configs.flatMap((s) => s.targets));
    for (const [name, s] of Object.entries(SERVICES)) {
      const svc = compose.services[name];
      expect(svc, name).toBeDefined();
      expect(svc?.command).toEqual(['run', name]);
      expect(svc?.environment?.KAFKA_BROKERS).toBe('kafka:9092');
      expect(String(svc?.environment?.REDIS_URL)).toMatch(/^redis:\/\/redis:/);
      expect(Number(svc?.environment?.HTTP_PORT)).toBe(s.port);
      expect(Object.keys(svc?.depends_on ?? {})).toEqual(expect.arrayContaining(['kafka', 'redis']));
      expect(targets).toContain(`${name}:${s.port}`);
    }
  });

  it("every Paver service's environment is one its config schema knows and accepts, files included", async () => {
    // `${VAR:-default}` as compose reads it with VAR unset.
    const copied = [...read('Dockerfile').matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap((m) =>
      m[1]!.split(' '),
    );
    const interpolate = (v: unknown) => String(v).replace(/\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}/g, '$1');
    for (const [name, s] of Object.entries(SERVICES)) {
      const env = Object.fromEntries(
        Object.entries(compose.services[name]?.environment ?? {}).map(([k, v]) => [k, interpolate(v)]),
      );
      const spec = (await s.load()).service;
      // A misspelt variable would be dropped silently by the schema: every key must be one it knows.
      const known = Object.keys((spec.envSchema as unknown as { shape: Record<string, unknown> }).shape);
      for (const k of Object.keys(env)) expect(known, `${name}: ${k}`).toContain(k);
      // Files are read inside the image (WORKDIR /app, the folders the Dockerfile copies): each must be there.
      for (const [k, v] of Object.entries(env).filter(([k]) => k.endsWith('_FILE'))) {
        expect(v, `${name}: ${k}`).toMatch(/^\/app\//);
        expect(copied, `${name}: ${k}`).toContain(v.split('/')[2]);
        expect(
          existsSync(new URL(`../../${v.slice('/app/'.length)}`, import.meta.url)),
          `${name}: ${k}`,
        ).toBe(true);
      }
      const noFiles = Object.fromEntries(Object.entries(env).filter(([k]) => !k.endsWith('_FILE')));
      expect(() => parseEnv(spec.envSchema as never, noFiles), name).not.toThrow();
    }
  });

  it('provisions Grafana with the Prometheus data source and the Paver dashboard', () => {
    const g = compose.services.grafana!;
    const mounts = new Map((g.volumes ?? []).map((v) => [v.split(':')[1]!, v.split(':')[0]!]));
    expect(mounts.get('/etc/grafana/provisioning')).toBe('./deploy/grafana/provisioning');
    expect(mounts.get('/var/lib/grafana/dashboards')).toBe('./deploy/grafana/dashboards');
    const ds = parse(read('deploy/grafana/provisioning/datasources/prometheus.yml')) as {
      datasources: { type: string; url: string }[];
    };
    const promPort = compose.services.prometheus?.ports?.[0]?.split(':')[1];
    expect(ds.datasources).toContainEqual(
      expect.objectContaining({ type: 'prometheus', url: `http://prometheus:${promPort}` }),
    );
    const provider = parse(read('deploy/grafana/provisioning/dashboards/paver.yml')) as {
      providers: { options: { path: string } }[];
    };
    expect(provider.providers[0]?.options.path).toBe('/var/lib/grafana/dashboards');
    expect(JSON.parse(read('deploy/grafana/dashboards/paver.json'))).toHaveProperty('uid');
  });
});

describe('.dockerignore', () => {
  it('keeps dependencies, build output, caches and VCS data out of the build context', () => {
    const lines = read('.dockerignore')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith('#'));
    expect(lines).toEqual(expect.arrayContaining(['node_modules', 'dist', '.git', '.cache']));
  });
});
