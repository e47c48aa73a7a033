import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import ts from 'typescript';
import { createMetrics } from '../../shared/metrics.js';

/**
 * What PromQL written for Paver (the Grafana dashboard, the alerting rules) may use: the series the services
 * export, with their labels, found in the source; and the metric names and labels an expression relies on.
 */

const root = fileURLToPath(new URL('../../', import.meta.url));

export function tsFiles(dir: string): string[] {
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
export function definedMetrics(files: string[]): Map<string, { kind: string; labels: string[] }> {
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
export function seriesNames(name: string, kind: string): string[] {
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
export function exportedSeries(): Map<string, Set<string>> {
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
export function metricNamesIn(expr: string): string[] {
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
export function closing(expr: string, open: number): number {
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
export function labelUses(expr: string): { metric: string; label: string }[] {
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
