import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { SERVICES, type ServiceName } from '../../cli/services.js';
import { parseEnv } from '../../shared/config.js';

// Every object `kubectl kustomize` renders is validated against the Kubernetes OpenAPI schema of its kind
// (kubernetes-models), KEDA's CRD schema (@kubernetes-models/keda) or the Prometheus Operator's
// (@kubernetes-models/prometheus-operator), all installed from npm.
const root = fileURLToPath(new URL('../../deploy/k8s/', import.meta.url));
const kubectl = (() => {
  try {
    execFileSync('kubectl', ['version', '--client'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
if (!kubectl) console.warn('deploy-k8s: kubectl is not installed; skipping the kustomize build tests');

interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  spec?: Record<string, unknown>;
  data?: Record<string, string>;
}
interface Container {
  name: string;
  image?: string;
  args?: string[];
  env?: { name: string; value?: string }[];
  envFrom?: { configMapRef?: { name: string }; secretRef?: { name: string; optional?: boolean } }[];
  ports?: { name?: string; containerPort: number }[];
  livenessProbe?: { httpGet?: { path: string; port: string | number } };
  readinessProbe?: { httpGet?: { path: string; port: string | number } };
  startupProbe?: { httpGet?: { path: string; port: string | number } };
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
}
interface Deployment extends K8sObject {
  spec: {
    selector: { matchLabels: Record<string, string> };
    template: {
      metadata: { labels: Record<string, string>; annotations?: Record<string, string> };
      spec: {
        containers: (Container & {
          securityContext?: { allowPrivilegeEscalation?: boolean; readOnlyRootFilesystem?: boolean };
        })[];
        securityContext?: { runAsNonRoot?: boolean; runAsUser?: number };
      };
    };
  };
}
interface ScaledObject extends K8sObject {
  spec: {
    scaleTargetRef: { name: string };
    minReplicaCount?: number;
    maxReplicaCount: number;
    triggers: { type: string; metadata: Record<string, string>; authenticationRef?: { name: string } }[];
  };
}

function build(dir: string): K8sObject[] {
  const out = execFileSync('kubectl', ['kustomize', `${root}${dir}`], { encoding: 'utf8' });
  return parseAllDocuments(out).map((d) => d.toJS() as K8sObject);
}

interface Validatable {
  validate(): void;
}
type ModelClass = new (data: unknown) => Validatable;
async function modelFor(apiVersion: string, kind: string): Promise<ModelClass> {
  const path = apiVersion.startsWith('keda.sh/')
    ? `@kubernetes-models/keda/${apiVersion}/${kind}`
    : apiVersion.startsWith('monitoring.coreos.com/')
      ? `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`
      : `kubernetes-models/${apiVersion}/${kind}`;
  const mod = (await import(path)) as Record<string, ModelClass>;
  const cls = mod[kind];
  if (!cls) throw new Error(`no schema model for ${apiVersion} ${kind}`);
  return cls;
}
async function validate(obj: K8sObject): Promise<void> {
  const Model = await modelFor(obj.apiVersion, obj.kind);
  new Model(obj).validate();
}

const find = <T extends K8sObject>(objs: K8sObject[], kind: string, name: string): T => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  if (!o) throw new Error(`${kind} ${name} missing`);
  return o as T;
};

/** The environment a pod of `dep` starts with: its ConfigMaps (envFrom) then its own env entries. */
function podEnv(objs: K8sObject[], dep: Deployment): Record<string, string> {
  const c = dep.spec.template.spec.containers[0]!;
  const env: Record<string, string> = {};
  for (const from of c.envFrom ?? []) {
    if (from.configMapRef) Object.assign(env, find(objs, 'ConfigMap', from.configMapRef.name).data);
  }
  for (const e of c.env ?? []) if (e.value !== undefined) env[e.name] = e.value;
  return env;
}

describe.skipIf(!kubectl)('deploy/k8s (kubectl kustomize + schema validation)', () => {
  it('the schema check is real: a malformed Deployment and ScaledObject are rejected', async () => {
    const dep = find<Deployment>(build('base'), 'Deployment', 'paver-detector');
    await expect(validate({ ...dep, spec: { ...dep.spec, replicas: 'two' } } as K8sObject)).rejects.toThrow(
      /replicas/,
    );
    const so = find<ScaledObject>(build('base'), 'ScaledObject', 'paver-detector');
    const { scaleTargetRef: _, ...noTarget } = so.spec;
    await expect(validate({ ...so, spec: noTarget })).rejects.toThrow(/scaleTargetRef/);
  });

  for (const dir of ['base', 'overlays/example']) {
    describe(dir, () => {
      const objs = build(dir);

      it('builds, and every object validates against its Kubernetes or KEDA schema', async () => {
        expect(objs.length).toBeGreaterThan(0);
        for (const o of objs)
          await expect(validate(o), `${o.kind}/${o.metadata.name}`).resolves.toBeUndefined();
      });

      for (const name of Object.keys(SERVICES) as ServiceName[]) {
        it(`${name}: Deployment, probes, resources, metrics port, Service, PDB and a KEDA Kafka-lag ScaledObject`, async () => {
          const port = SERVICES[name].port;
          const dep = find<Deployment>(objs, 'Deployment', `paver-${name}`);
          const c = dep.spec.template.spec.containers[0]!;
          expect(c.args).toEqual(['run', name]);
          const http = c.ports?.find((p) => p.name === 'http');
          expect(http?.containerPort).toBe(port);
          // Scraped where the service serves /metrics (shared/http.ts), on the same port.
          const annotations = dep.spec.template.metadata.annotations ?? {};
          expect(annotations['prometheus.io/scrape']).toBe('true');
          expect(annotations['prometheus.io/port']).toBe(String(port));
          expect(annotations['prometheus.io/path']).toBe('/metrics');
          // Non-root, as the image's USER node (uid 1000); nothing in the container is writable but /tmp.
          expect(dep.spec.template.spec.securityContext?.runAsNonRoot).toBe(true);
          expect(dep.spec.template.spec.securityContext?.runAsUser).toBe(1000);
          expect(c.securityContext?.allowPrivilegeEscalation).toBe(false);
          expect(c.securityContext?.readOnlyRootFilesystem).toBe(true);
          expect(c.livenessProbe?.httpGet?.path).toBe('/healthz');
          expect(c.readinessProbe?.httpGet?.path).toBe('/readyz');
          expect(c.resources?.requests?.cpu).toBeDefined();
          expect(c.resources?.requests?.memory).toBeDefined();
          expect(c.resources?.limits?.memory).toBeDefined();
          // SASL/TLS credentials come from a Secret reference, never from the ConfigMap.
          expect(c.envFrom?.some((f) => f.secretRef?.name === 'paver-credentials')).toBe(true);

          // The pod's environment must pass the service's own config schema (file paths are mounted at
          // run time, so the file-existence check is left out here).
          const env = podEnv(objs, dep);
          expect(Number(env.HTTP_PORT)).toBe(port);
          const spec = (await SERVICES[name].load()).service;
          // The Secret paver-credentials is created by the operator (see the overlay); stand in for it here.
          // SASL credentials without a mechanism are refused (they would be dropped): only where one is set.
          const secret = env.KAFKA_SASL_MECHANISM
            ? { KAFKA_SASL_USERNAME: 'user', KAFKA_SASL_PASSWORD: 'password' }
            : {};
          const noFiles = Object.fromEntries(Object.entries(env).filter(([k]) => !k.endsWith('_FILE')));
          const parsed = parseEnv(spec.envSchema as never, { ...secret, ...noFiles }) as Record<
            string,
            unknown
          >;
          // A misspelt variable would be dropped silently by the schema: every key must be one it knows.
          const known = Object.keys((spec.envSchema as unknown as { shape: Record<string, unknown> }).shape);
          expect(known.length).toBeGreaterThan(10);
          for (const k of Object.keys(env)) expect(known, k).toContain(k);
          // The service appends its name to KAFKA_CLIENT_ID (shared/service.ts): a client id that already ends
          // with it reads `paver-detector-detector` in the broker's logs and quotas.
          expect(String(parsed.KAFKA_CLIENT_ID)).not.toMatch(new RegExp(`-${name}$`));

          const labels = dep.spec.template.metadata.labels;
          const selects = (sel: Record<string, string>) =>
            Object.entries(sel).every(([k, v]) => labels[k] === v);
          const svc = find<
            K8sObject & { spec: { selector: Record<string, string>; ports: { port: number }[] } }
          >(objs, 'Service', `paver-${name}`);
          expect(selects(svc.spec.selector)).toBe(true);
          expect(svc.spec.ports.map((p) => p.port)).toContain(port);
          const pdb = find<K8sObject & { spec: { selector: { matchLabels: Record<string, string> } } }>(
            objs,
            'PodDisruptionBudget',
            `paver-${name}`,
          );
          expect(selects(pdb.spec.selector.matchLabels)).toBe(true);

          const so = find<ScaledObject>(objs, 'ScaledObject', `paver-${name}`);
          expect(so.spec.scaleTargetRef.name).toBe(dep.metadata.name);
          const trigger = so.spec.triggers.find((t) => t.type === 'kafka');
          expect(trigger, 'kafka lag trigger').toBeDefined();
          const m = trigger!.metadata;
          // KEDA reads *FromEnv from the target container's environment: the variable must be there.
          const resolve = (key: string) => {
            const from = m[`${key}FromEnv`];
            if (from === undefined) return m[key];
            expect(env, `${key}FromEnv: ${from}`).toHaveProperty(from);
            return env[from];
          };
          // The scaler watches the very group and brokers the service uses.
          expect(resolve('consumerGroup')).toBe(spec.groupId(parsed as never));
          expect(resolve('bootstrapServers')?.split(',')).toEqual(parsed.KAFKA_BROKERS);
          // A named topic must be one the service consumes: the tool-calls topic, unless the service lists
          // its inputs (ingest reads the OTLP topic, and its scaler must name it).
          const topic = resolve('topic');
          const inputs =
            'inputTopics' in spec
              ? spec.inputTopics(parsed as never)
              : [parsed.PAVER_TOPIC_TOOL_CALLS as string];
          if ('inputTopics' in spec) expect(topic, 'topic of a service that lists its inputs').toBeDefined();
          if (topic !== undefined) expect(inputs).toContain(topic);
          expect(Number(m.lagThreshold)).toBeGreaterThan(0);
          // More consumers than partitions would sit idle.
          expect(so.spec.maxReplicaCount).toBeLessThanOrEqual(parsed.KAFKA_TOPIC_PARTITIONS as number);
          expect(so.spec.minReplicaCount ?? 0).toBeGreaterThanOrEqual(1);
          if (trigger!.authenticationRef)
            find(objs, 'TriggerAuthentication', trigger!.authenticationRef.name);
        });
      }
    });
  }

  it('the example overlay puts everything in its namespace and pins the image', () => {
    const objs = build('overlays/example');
    for (const o of objs.filter((x) => x.kind !== 'Namespace')) expect(o.metadata.namespace).toBe('paver');
    for (const d of objs.filter((x): x is Deployment => x.kind === 'Deployment')) {
      expect(d.spec.template.spec.containers[0]!.image).toMatch(/^registry\.example\.com\/paver:\d/);
    }
  });

  it('the example overlay includes the alerting rules; the base (no Prometheus Operator assumed) does not', () => {
    const rule = find(build('overlays/example'), 'PrometheusRule', 'paver');
    expect(rule.apiVersion).toBe('monitoring.coreos.com/v1');
    expect((rule.spec as { groups: unknown[] }).groups.length).toBeGreaterThan(0);
    expect(build('base').some((o) => o.kind === 'PrometheusRule')).toBe(false);
  });
});
