import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PrometheusRule } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule';
import { afterAll, describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';
import { exportedSeries, labelUses, metricNamesIn } from '../helpers/promql.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const read = (p: string) => readFileSync(join(root, p), 'utf8');

interface Rule {
  alert: string;
  expr: string;
  for?: string;
  labels: { severity: string };
  annotations: Record<string, string>;
}
interface Group {
  name: string;
  rules: Rule[];
}
const ruleFile = parse(read('deploy/prometheus/alerts.yml')) as { groups: Group[] };
const prometheusRule = parse(read('deploy/k8s/alerts/prometheus-rule.yaml')) as {
  apiVersion: string;
  kind: string;
  metadata: { name: string };
  spec: { groups: Group[] };
};
const rules = ruleFile.groups.flatMap((g) => g.rules);

const promtool = (() => {
  try {
    execFileSync('promtool', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
if (!promtool) console.warn('deploy-alerts: promtool is not installed; skipping the promtool checks');

describe('alerting rules (deploy/prometheus/alerts.yml, deploy/k8s/alerts)', () => {
  const series = exportedSeries();

  it('are what scripts/gen-alerts.mjs generates (an edit made to the YAML alone is lost at the next run)', () => {
    const generated = JSON.parse(
      execFileSync(process.execPath, [join(root, 'scripts/gen-alerts.mjs'), '--stdout'], {
        encoding: 'utf8',
      }),
    ) as Record<string, string>;
    expect(Object.keys(generated).sort()).toEqual([
      'deploy/k8s/alerts/prometheus-rule.yaml',
      'deploy/prometheus/alerts.yml',
    ]);
    for (const [path, text] of Object.entries(generated)) expect(text, path).toBe(read(path));
  });

  it('the PrometheusRule holds the same groups and validates against the operator schema', () => {
    expect(prometheusRule.spec.groups).toEqual(ruleFile.groups);
    new PrometheusRule(prometheusRule as ConstructorParameters<typeof PrometheusRule>[0]).validate();
    // The schema check is real: a rule without its expression is refused.
    const broken = structuredClone(prometheusRule);
    delete (broken.spec.groups[0]!.rules[0] as Partial<Rule>).expr;
    expect(() =>
      new PrometheusRule(broken as ConstructorParameters<typeof PrometheusRule>[0]).validate(),
    ).toThrow(/expr/);
  });

  it('each alert is named once, has a severity, a summary, a description and a runbook in the README', () => {
    expect(rules.length).toBeGreaterThanOrEqual(15);
    const names = rules.map((r) => r.alert);
    expect(new Set(names).size).toBe(names.length);
    const readme = read('README.md');
    const section = readme.slice(readme.indexOf('\n### Alerts'));
    expect(section.length).toBeGreaterThan(100);
    for (const r of rules) {
      expect(r.alert).toMatch(/^Paver[A-Z][A-Za-z]+$/);
      expect(['critical', 'warning', 'info'], r.alert).toContain(r.labels.severity);
      expect(r.annotations.summary, r.alert).toBeTruthy();
      expect(r.annotations.description, r.alert).toBeTruthy();
      expect(r.annotations.runbook, r.alert).toBe(`README.md#alerts, ${r.alert}`);
      expect(section, `README has no runbook entry for ${r.alert}`).toContain(`\`${r.alert}\``);
      if (r.for !== undefined) expect(r.for).toMatch(/^\d+[smh]$/);
    }
  });

  it('every expression uses only series the services export, with labels those series have', () => {
    const bad: string[] = [];
    for (const r of rules) {
      const names = metricNamesIn(r.expr);
      expect(names.length, r.alert).toBeGreaterThan(0);
      for (const n of names) if (!series.has(n)) bad.push(`${r.alert}: ${n}`);
      for (const { metric, label } of labelUses(r.expr))
        if (!series.get(metric)?.has(label)) bad.push(`${r.alert}: ${metric} has no label ${label}`);
    }
    expect(bad).toEqual([]);
    // Alerts group by `service`: every series has it (the registry's default label), whatever the scrape's job.
    for (const r of rules) expect(r.expr, r.alert).toMatch(/by \([^)]*\bservice\b/);
  });

  it('Prometheus loads them: prometheus.yml names the rule file and Compose mounts it there', () => {
    const prom = parse(read('deploy/prometheus/prometheus.yml')) as { rule_files?: string[] };
    expect(prom.rule_files).toEqual(['/etc/prometheus/alerts.yml']);
    const compose = parse(read('docker-compose.yml'), { merge: true }) as {
      services: Record<string, { volumes?: string[] }>;
    };
    expect(compose.services.prometheus?.volumes).toContain(
      './deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro',
    );
  });

  describe.skipIf(!promtool)('promtool', () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-alerts-'));
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    it('checks both files', () => {
      writeFileSync(join(dir, 'k8s-rules.yml'), stringify({ groups: prometheusRule.spec.groups }));
      const out = execFileSync(
        'promtool',
        ['check', 'rules', join(root, 'deploy/prometheus/alerts.yml'), join(dir, 'k8s-rules.yml')],
        { encoding: 'utf8' },
      );
      expect(out).toContain(`SUCCESS: ${rules.length} rules found`);
    });

    /**
     * What the alerts mean, on series as the services export them: `promtool test rules` evaluates the rules over
     * time (one sample a minute). Annotations are prose (checked above), so the rules run without them here and
     * each case compares the alerts' labels.
     */
    it('fire when they should and stay quiet when they should not', () => {
      const bare = {
        groups: ruleFile.groups.map((g) => ({
          name: g.name,
          rules: g.rules.map(({ annotations: _, ...r }) => r),
        })),
      };
      writeFileSync(join(dir, 'rules.yml'), stringify(bare));
      const s = (metric: string, labels: Record<string, string>, values: string) => ({
        series: `${metric}{${Object.entries({ service: 'detector', ...labels })
          .map(([k, v]) => `${k}="${v}"`)
          .join(',')}}`,
        values,
      });
      const fires = (alertname: string, at: string, labels: Record<string, string>[]) => ({
        eval_time: at,
        alertname,
        exp_alerts: labels.map((l) => ({ exp_labels: l })),
      });
      const calls = { topic: 'calls' };
      const proposals = (service: string, origin: string, state: string, outcome: string, values: string) =>
        s('paver_autoseq_proposals_total', { service, origin, state, outcome }, values);
      const tests = [
        {
          // A lag that does not move while nothing is consumed: stalled. The same lag while events are consumed
          // (a busy consumer) is not.
          input_series: [
            s('paver_consumer_lag', { ...calls, partition: '0' }, '5x40'),
            s('paver_events_consumed_total', { ...calls, outcome: 'processed' }, '100x40'),
            s('paver_consumer_lag', { service: 'autoseq', ...calls, partition: '0' }, '5x40'),
            s(
              'paver_events_consumed_total',
              { service: 'autoseq', ...calls, outcome: 'processed' },
              '0+50x40',
            ),
          ],
          alert_rule_test: [
            fires('PaverConsumerStalled', '10m', []),
            fires('PaverConsumerStalled', '30m', [{ severity: 'critical', service: 'detector', ...calls }]),
          ],
        },
        {
          // Failing batches with none succeeding; failures among successes are retries that work.
          input_series: [
            s('paver_batch_processing_seconds_count', { ...calls, outcome: 'failed' }, '0+3x30'),
            s('paver_batch_processing_seconds_count', { ...calls, outcome: 'ok' }, '10x30'),
            s(
              'paver_batch_processing_seconds_count',
              { service: 'flows', ...calls, outcome: 'failed' },
              '0+1x30',
            ),
            s(
              'paver_batch_processing_seconds_count',
              { service: 'flows', ...calls, outcome: 'ok' },
              '0+20x30',
            ),
          ],
          alert_rule_test: [
            fires('PaverBatchesFailing', '25m', [{ severity: 'critical', service: 'detector', ...calls }]),
          ],
        },
        {
          // Over 5 minutes behind for 10 minutes; 4 minutes behind is within bounds.
          input_series: [
            s('paver_consumer_oldest_unprocessed_age_seconds', { ...calls, partition: '0' }, '400x30'),
            s('paver_consumer_oldest_unprocessed_age_seconds', { ...calls, partition: '1' }, '30x30'),
            s(
              'paver_consumer_oldest_unprocessed_age_seconds',
              { service: 'flows', ...calls, partition: '0' },
              '240x30',
            ),
          ],
          alert_rule_test: [
            fires('PaverConsumerFallingBehind', '5m', []),
            fires('PaverConsumerFallingBehind', '15m', [
              { severity: 'warning', service: 'detector', ...calls },
            ]),
          ],
        },
        {
          // Active proposals: 20% misses over enough volume fires; 5% does not; 50% of too few does not.
          input_series: [
            proposals('autoseq', 'learned', 'active', 'hit', '0+4x90'),
            proposals('autoseq', 'learned', 'active', 'miss', '0+1x90'),
            proposals('autoseq', 'typed', 'active', 'hit', '0+19x90'),
            proposals('autoseq', 'typed', 'active', 'miss', '0+1x90'),
            proposals('autoseq2', 'learned', 'active', 'hit', '0+0.2x90'),
            proposals('autoseq2', 'learned', 'active', 'miss', '0+0.2x90'),
            proposals('autoseq', 'learned', 'shadow', 'miss', '0+50x90'),
          ],
          alert_rule_test: [
            fires('PaverActiveProposalsImprecise', '80m', [
              { severity: 'critical', service: 'autoseq', origin: 'learned' },
            ]),
          ],
        },
        {
          // A server error on a service route fires; readiness answering 503 (starting, rebuilding) does not.
          input_series: [
            s(
              'paver_http_request_duration_seconds_count',
              { service: 'flows', method: 'POST', route: '/flows/select', status: '500' },
              '0+1x30',
            ),
            s(
              'paver_http_request_duration_seconds_count',
              { service: 'flows', method: 'GET', route: '/readyz', status: '503' },
              '0+5x30',
            ),
          ],
          alert_rule_test: [
            fires('PaverHttpErrors', '20m', [
              { severity: 'warning', service: 'flows', route: '/flows/select' },
            ]),
          ],
        },
        {
          // A dead letter fires at once (no `for`), with its reason; none fires nothing.
          input_series: [
            s('paver_dead_letters_total', { reason: 'invalid' }, '0 0 0 1 1 1 1 1 1 1'),
            s('paver_dead_letters_total', { service: 'flows', reason: 'invalid' }, '0x10'),
          ],
          alert_rule_test: [
            fires('PaverDeadLetters', '2m', []),
            fires('PaverDeadLetters', '5m', [
              { severity: 'warning', service: 'detector', reason: 'invalid' },
            ]),
          ],
        },
      ].map((t) => ({ interval: '1m', ...t }));
      writeFileSync(
        join(dir, 'tests.yml'),
        stringify({ rule_files: ['rules.yml'], evaluation_interval: '1m', tests }),
      );
      const run = () =>
        execFileSync('promtool', ['test', 'rules', join(dir, 'tests.yml')], {
          encoding: 'utf8',
          stdio: 'pipe',
        });
      expect(run()).toContain('SUCCESS');
      // The cases can fail: the stalled alert with its condition turned around is caught.
      const flipped = structuredClone(bare);
      const stalled = flipped.groups.flatMap((g) => g.rules).find((r) => r.alert === 'PaverConsumerStalled')!;
      stalled.expr = stalled.expr.replace('unless', 'and');
      writeFileSync(join(dir, 'rules.yml'), stringify(flipped));
      expect(run).toThrow(/PaverConsumerStalled/);
    });
  });
});
