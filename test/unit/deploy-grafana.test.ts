import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { createMetrics } from '../../shared/metrics.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dashboard = JSON.parse(readFileSync(join(root, 'deploy/grafana/dashboards/paver.json'), 'utf8')) as {
  uid: string;
  panels: { type: string; title: string; targets?: { expr: string }[] }[];
  templating: { list: { name: string; query?: unknown; definition?: string }[] };
};

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (name === 'node_modules' || name === 'test' || name === 'core') return [];
    if (statSync(p).isDirectory()) return tsFiles(p);
    return p.endsWith('.ts') && !p.endsWith('.test.ts') ? [p] : [];
  });
}

const KINDS = new Set(['Counter', 'Gauge', 'Histogram', 'Summary']);
/**
 * Metric definitions in the source: every `new Counter|Gauge|Histogram|Summary({ name: '…', labelNames })` found
 * by the TypeScript parser (not a regex), so a metric added anywhere in shared/ or a service appears here.
 */
function definedMetrics(files: string[]): Map<string, { kind: string; labels: string[] }> {
  const found = new Map<string, { kind: string; labels: string[] }>();
  for (const file of files) {
    const src = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022, true);
    const visit = (node: ts.Node): void => {
      if (
        ts.isNewExpression(node) &&
        ts.isIdentifier(node.expression) &&
        KINDS.has(node.expression.text) &&
        node.arguments?.[0] &&
        ts.isObjectLiteralExpression(node.arguments[0])
      ) {
        let name: string | undefined;
        const labels: string[] = [];
        for (const prop of node.arguments[0].properties) {
          if (!ts.isPropertyAssignment(prop) || !ts.isIdentifier(prop.name)) continue;
          if (prop.name.text === 'name' && ts.isStringLiteralLike(prop.initializer))
            name = prop.initializer.text;
          if (prop.name.text === 'labelNames' && ts.isArrayLiteralExpression(prop.initializer)) {
            for (const e of prop.initializer.elements) {
              if (!ts.isStringLiteralLike(e)) throw new Error(`${file}: labelNames of ${name} not literal`);
              labels.push(e.text);
            }
          }
        }
        if (name) found.set(name, { kind: node.expression.text, labels });
      }
      ts.forEachChild(node, visit);
    };
    visit(src);
  }
  return found;
}

/** Series names a metric produces in the Prometheus exposition format. */
function seriesNames(name: string, kind: string): string[] {
  if (kind === 'Histogram') return [`${name}_bucket`, `${name}_sum`, `${name}_count`];
  if (kind === 'Summary') return [name, `${name}_sum`, `${name}_count`];
  return [name];
}

/**
 * Labels every series has besides its own: the registry's default label (`service`, shared/metrics.ts) and the
 * ones Prometheus adds to every scraped series (`job`, `instance`).
 */
const COMMON_LABELS = ['service', 'job', 'instance'];

/** Every series name the services export, with the labels a query may use on it. */
function exportedSeries(): Map<string, Set<string>> {
  const series = new Map<string, Set<string>>();
  const add = (name: string, kind: string, labels: readonly string[]) => {
    for (const s of seriesNames(name, kind)) {
      const extra = s.endsWith('_bucket') ? ['le'] : kind === 'Summary' && s === name ? ['quantile'] : [];
      series.set(s, new Set([...COMMON_LABELS, ...labels, ...extra]));
    }
  };
  const sources = definedMetrics([
    ...tsFiles(join(root, 'shared')),
    ...readdirSync(join(root, 'services')).flatMap((s) => tsFiles(join(root, 'services', s, 'src'))),
  ]);
  for (const [name, { kind, labels }] of sources) add(name, kind, labels);
  // The runtime metrics and Node's default metrics as a fresh registry really registers them.
  const { registry } = createMetrics('test', new Registry());
  for (const m of (
    registry as unknown as { getMetricsAsArray(): { name: string; type: string; labelNames: string[] }[] }
  ).getMetricsAsArray()) {
    const kind = m.type === 'histogram' ? 'Histogram' : m.type === 'summary' ? 'Summary' : 'Counter';
    add(m.name, kind, m.labelNames);
  }
  return series;
}

const KEYWORDS = new Set([
  'and',
  'or',
  'unless',
  'bool',
  'offset',
  'by',
  'without',
  'on',
  'ignoring',
  'inf',
  'nan',
  'group_left',
  'group_right',
]);
/** Metric names a PromQL expression selects: identifiers that are not functions, keywords or label names. */
function metricNamesIn(expr: string): string[] {
  const stripped = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""') // string literals
    .replace(/\{[^}]*\}/g, '') // label matchers
    .replace(/\[[^\]]*\]/g, '') // range selectors ($__rate_interval, 5m)
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, '') // label lists
    .replace(/\$\w+/g, ''); // Grafana variables
  const out: string[] = [];
  for (const m of stripped.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const after = stripped.slice(m.index + m[0].length).trimStart();
    if (after.startsWith('(') || KEYWORDS.has(m[0].toLowerCase())) continue;
    out.push(m[0]);
  }
  return out;
}

/** Index of the parenthesis closing the one opened at `open`. */
function closing(expr: string, open: number): number {
  let depth = 0;
  for (let i = open; i < expr.length; i++) {
    if (expr[i] === '(') depth++;
    else if (expr[i] === ')' && --depth === 0) return i;
  }
  throw new Error(`unbalanced parentheses: ${expr}`);
}

/**
 * Labels a PromQL expression relies on, per metric: each selector's matchers (`m{a="x"}`) and each aggregation's
 * `by (…)` labels, which every metric inside that aggregation must have (a missing one groups everything under
 * an empty value, or matches nothing: the panel shows nothing or one flat line, without an error).
 */
function labelUses(expr: string): { metric: string; label: string }[] {
  const noStrings = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  const uses: { metric: string; label: string }[] = [];
  for (const m of noStrings.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}/g)) {
    for (const l of m[2]!.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)/g))
      uses.push({ metric: m[1]!, label: l[1]! });
  }
  for (const b of noStrings.matchAll(/\bby\s*\(([^)]*)\)\s*\(/g)) {
    const open = b.index + b[0].length - 1;
    const inner = noStrings.slice(open, closing(noStrings, open) + 1);
    const labels = b[1]!
      .split(',')
      .map((l) => l.trim())
      .filter(Boolean);
    for (const metric of metricNamesIn(inner)) for (const label of labels) uses.push({ metric, label });
  }
  return uses;
}

const queries = (): string[] => [
  ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)),
  ...dashboard.templating.list.flatMap((v) => (v.definition ? [v.definition] : [])),
];

describe('Grafana dashboard (deploy/grafana/dashboards/paver.json)', () => {
  const series = exportedSeries();
  const exported = new Set(series.keys());

  it('is what scripts/gen-dashboard.mjs generates (an edit made to the JSON alone is lost at the next run)', () => {
    const generated = execFileSync(process.execPath, [join(root, 'scripts/gen-dashboard.mjs'), '--stdout'], {
      encoding: 'utf8',
    });
    expect(JSON.parse(generated)).toEqual(dashboard);
  });

  it('finds the metrics the code defines (the scan is not empty and sees each service)', () => {
    for (const name of [
      'paver_events_consumed_total',
      'paver_batch_processing_seconds_bucket',
      'paver_detector_candidates_published_total',
      'paver_autoseq_llm_steps_saved_total',
      'paver_sequencer_violations_total',
      'paver_flows_selections_total',
      'paver_sequencer_state_reads_total',
      'paver_ingest_messages_total',
      'process_resident_memory_bytes',
    ]) {
      expect(exported, name).toContain(name);
    }
  });

  it('the query parser picks out metric names and nothing else', () => {
    expect(
      metricNamesIn(
        'histogram_quantile(0.99, sum by (service, le) (rate(paver_x_bucket{service=~"$service",a="b(c)"}[$__rate_interval]))) / on(service) group_left max(up)',
      ),
    ).toEqual(['paver_x_bucket', 'up']);
    expect(metricNamesIn('label_values(paver_events_consumed_total, service)')).toEqual([
      'paver_events_consumed_total',
      'service',
    ]);
  });

  it('every query uses only metric names the services export', () => {
    const used = new Set<string>();
    for (const q of dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr))) {
      for (const n of metricNamesIn(q)) used.add(n);
    }
    expect(used.size).toBeGreaterThan(10);
    const unknown = [...used].filter((n) => !exported.has(n));
    expect(unknown).toEqual([]);
    // A name no service exports is caught.
    expect(exported.has('paver_no_such_metric_total')).toBe(false);
    // The templating query's metric exists too (its second argument is a label).
    for (const d of dashboard.templating.list.flatMap((v) => (v.definition ? [v.definition] : []))) {
      expect(exported).toContain(metricNamesIn(d)[0]);
    }
    expect(queries().length).toBeGreaterThan(0);
  });

  it('every label a query matches on or groups by is one its metric has', () => {
    const bad: string[] = [];
    let checked = 0;
    for (const q of dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr))) {
      for (const { metric, label } of labelUses(q)) {
        checked++;
        if (!series.get(metric)?.has(label)) bad.push(`${metric}: ${label} (in ${q})`);
      }
    }
    expect(checked).toBeGreaterThan(30);
    expect(bad).toEqual([]);
    // The check is real: a label the metric lacks, in a matcher or in a grouping, is caught.
    const wrong = (q: string) => labelUses(q).filter((u) => !series.get(u.metric)?.has(u.label));
    expect(wrong('sum by (status) (rate(paver_flows_selections_total[5m]))')).toHaveLength(1);
    expect(wrong('rate(paver_dead_letters_total{outcome="x"}[5m])')).toHaveLength(1);
    expect(
      wrong(
        'histogram_quantile(0.9, sum by (le, route) (rate(paver_http_request_duration_seconds_bucket[5m])))',
      ),
    ).toEqual([]);
    expect(wrong('sum by (le) (rate(paver_http_request_duration_seconds_count[5m]))')).toHaveLength(1);
  });

  it('has the panels operators need', () => {
    const exprs = queries().join('\n');
    for (const needle of [
      /paver_events_consumed_total[^\n]*outcome|outcome[^\n]*paver_events_consumed_total/,
      /paver_consumer_lag/,
      /reason[^\n]*paver_dead_letters_total/,
      /paver_batch_processing_seconds_bucket/,
      /paver_detector_candidates_published_total/,
      /paver_autoseq_llm_steps_saved_total/,
      /source[^\n]*paver_sequencer_state_reads_total/,
      /outcome[^\n]*paver_ingest_messages_total/,
      /outcome[^\n]*paver_ingest_spans_total/,
      /paver_ingest_events_total/,
      /paver_ingest_payloads_omitted_total/,
      /paver_ingest_corrupt_state_total/,
    ]) {
      expect(exprs).toMatch(needle);
    }
    const ids = dashboard.panels.map((p) => (p as unknown as { id: number }).id);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
