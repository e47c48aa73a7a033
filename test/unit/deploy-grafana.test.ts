import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { exportedSeries, labelUses, metricNamesIn } from '../helpers/promql.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dashboard = JSON.parse(readFileSync(join(root, 'deploy/grafana/dashboards/paver.json'), 'utf8')) as {
  uid: string;
  panels: { type: string; title: string; targets?: { expr: string }[] }[];
  templating: { list: { name: string; query?: unknown; definition?: string }[] };
};

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
