// Writes deploy/grafana/dashboards/paver.json. The dashboard is data; this script keeps its layout regular.
// Run: node scripts/gen-dashboard.mjs (then prettier). Edit the dashboard here, never the JSON alone:
// test/unit/deploy-grafana.test.ts runs this script with --stdout (prints instead of writing) and fails when its
// output differs from the committed JSON, and checks every query.
import { writeFileSync } from 'node:fs';

const ds = { type: 'prometheus', uid: '${datasource}' };
const RI = '$__rate_interval';
let id = 0;
const panels = [];
let y = 0;
function row(title) {
  panels.push({
    type: 'row',
    id: ++id,
    title,
    collapsed: false,
    gridPos: { h: 1, w: 24, x: 0, y },
    panels: [],
  });
  y += 1;
}
function ts(title, unit, targets, { w = 12, x = 0, description, stack = false } = {}) {
  panels.push({
    type: 'timeseries',
    id: ++id,
    title,
    ...(description ? { description } : {}),
    datasource: ds,
    gridPos: { h: 8, w, x, y },
    fieldConfig: {
      defaults: {
        unit,
        custom: {
          drawStyle: 'line',
          fillOpacity: stack ? 30 : 10,
          stacking: { mode: stack ? 'normal' : 'none' },
        },
      },
      overrides: [],
    },
    options: {
      legend: { displayMode: 'table', placement: 'bottom', calcs: ['lastNotNull', 'max'] },
      tooltip: { mode: 'multi' },
    },
    targets: targets.map(([expr, legendFormat], i) => ({
      datasource: ds,
      refId: String.fromCharCode(65 + i),
      expr,
      legendFormat,
    })),
  });
  if (x + w >= 24) y += 8;
}
function stat(title, unit, expr, { w = 6, x = 0, description } = {}) {
  panels.push({
    type: 'stat',
    id: ++id,
    title,
    ...(description ? { description } : {}),
    datasource: ds,
    gridPos: { h: 4, w, x, y },
    fieldConfig: { defaults: { unit }, overrides: [] },
    options: {
      reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
      colorMode: 'value',
      graphMode: 'area',
    },
    targets: [{ datasource: ds, refId: 'A', expr, legendFormat: title }],
  });
  if (x + w >= 24) y += 4;
}
const svc = 'service=~"$service"';

row('Overview');
stat('Events/s (all services)', 'ops', `sum(rate(paver_events_consumed_total{${svc}}[${RI}]))`, { x: 0 });
stat('Consumer lag (messages)', 'short', `sum(paver_consumer_lag{${svc}})`, { x: 6 });
stat('Dead letters (range)', 'short', `sum(increase(paver_dead_letters_total{${svc}}[$__range]))`, { x: 12 });
stat('LLM steps saved (range)', 'short', `sum(increase(paver_autoseq_llm_steps_saved_total[$__range]))`, {
  x: 18,
  description:
    'Tool calls the agent runtime executed from a unique auto-seq decision, or that equal (tool and arguments) an active learned proposal: one LLM step each.',
});

row('Throughput and lag');
ts('Events/s by service and outcome', 'ops', [
  [`sum by (service, outcome) (rate(paver_events_consumed_total{${svc}}[${RI}]))`, '{{service}} {{outcome}}'],
]);
ts(
  'Consumer lag by service and topic',
  'short',
  [[`sum by (service, topic) (paver_consumer_lag{${svc}})`, '{{service}} {{topic}}']],
  {
    x: 12,
    description:
      "High watermark minus the group's committed offset, per assigned partition, polled every PAVER_LAG_POLL_MS (summed).",
  },
);
ts('Dead letters/s by reason', 'ops', [
  [`sum by (service, reason) (rate(paver_dead_letters_total{${svc}}[${RI}]))`, '{{service}} {{reason}}'],
]);
ts(
  'Batch processing latency',
  's',
  [
    [
      `histogram_quantile(0.99, sum by (service, le) (rate(paver_batch_processing_seconds_bucket{${svc},outcome="ok"}[${RI}])))`,
      'p99 {{service}}',
    ],
    [
      `histogram_quantile(0.5, sum by (service, le) (rate(paver_batch_processing_seconds_bucket{${svc},outcome="ok"}[${RI}])))`,
      'p50 {{service}}',
    ],
  ],
  { x: 12 },
);
ts('Records published/s by topic', 'ops', [
  [`sum by (service, topic) (rate(paver_records_published_total{${svc}}[${RI}]))`, '{{service}} → {{topic}}'],
]);
ts(
  'Retries, crashes and rebalances',
  'short',
  [
    [`sum by (service, code) (increase(paver_retries_total{${svc}}[${RI}]))`, 'retry {{service}} {{code}}'],
    [`sum by (service) (increase(paver_consumer_crashes_total{${svc}}[${RI}]))`, 'crash {{service}}'],
    [`sum by (service) (increase(paver_consumer_rebalances_total{${svc}}[${RI}]))`, 'rebalance {{service}}'],
    [`max by (service) (paver_consumer_paused{${svc}})`, 'paused {{service}}'],
  ],
  { x: 12 },
);
ts('HTTP latency p99 by service and route', 's', [
  [
    `histogram_quantile(0.99, sum by (service, route, le) (rate(paver_http_request_duration_seconds_bucket{${svc}}[${RI}])))`,
    '{{service}} {{route}}',
  ],
]);
ts(
  'Oldest unprocessed event age',
  's',
  [[`max by (service) (paver_consumer_oldest_unprocessed_age_seconds{${svc}})`, '{{service}}']],
  { x: 12, description: 'Age of the oldest event not yet processed on any assigned partition.' },
);
ts(
  'Redis state: losses noticed and rebuilds from Kafka',
  'short',
  [
    [`sum by (outcome) (increase(paver_detector_rebuilds_total[${RI}]))`, 'detector rebuild {{outcome}}'],
    [`max(paver_detector_rebuilding)`, 'detector rebuilding'],
    [`sum by (outcome) (increase(paver_ingest_rebuilds_total[${RI}]))`, 'ingest rebuild {{outcome}}'],
    [`max(paver_ingest_rebuilding)`, 'ingest rebuilding'],
    [
      `sum by (reason, outcome) (increase(paver_flows_state_rebuilds_total[${RI}]))`,
      'flows {{reason}} {{outcome}}',
    ],
    [
      `sum(increase(paver_sequencer_state_losses_total[${RI}]))`,
      'sequencer loss (sessions restored from the session topic)',
    ],
    [`sum(increase(paver_sequencer_sessions_restored_total[${RI}]))`, 'sequencer sessions restored'],
    [
      `sum(increase(paver_autoseq_state_losses_total[${RI}]))`,
      'autoseq loss (rules restored from the rules topic)',
    ],
    [`sum(increase(paver_autoseq_rules_restored_contexts_total[${RI}]))`, 'autoseq contexts restored'],
    [`max(paver_autoseq_rules_snapshot_pending)`, 'autoseq contexts not yet copied'],
    [
      `sum(increase(paver_autoseq_rules_snapshot_flushes_total{outcome="failed"}[${RI}]))`,
      'autoseq rule copies failed',
    ],
    [
      `sum by (outcome) (increase(paver_autoseq_scopes_retired_total[${RI}]))`,
      'autoseq idle scopes {{outcome}} (AUTOSEQ_LEARN_SCOPE_TTL_MS)',
    ],
  ],
  {
    w: 24,
    description:
      'A Redis that lost its state (FLUSHALL, restart without persistence, failover to an empty replica).',
  },
);
ts('Autoseq proposals/s by origin, state and outcome', 'ops', [
  [
    `sum by (origin, state, outcome) (rate(paver_autoseq_proposals_total[${RI}]))`,
    '{{origin}} {{state}} {{outcome}}',
  ],
]);
// Instances sharing scopes each count theirs: max across instances, not sum (see the autoseq README).
ts('Active learned rules', 'short', [[`max(paver_autoseq_active_rules)`, 'active rules']], { x: 12 });

row('Flows and savings');
ts('Flow candidates published/s by status', 'ops', [
  [`sum by (status) (rate(paver_detector_candidates_published_total[${RI}]))`, '{{status}}'],
  [
    `sum by (outcome) (rate(paver_detector_scopes_retired_total[${RI}]))`,
    'idle scopes {{outcome}} (DETECTOR_SCOPE_TTL_MS)',
  ],
]);
ts(
  'Candidate decisions and registered flows',
  'short',
  [
    [`sum by (status) (increase(paver_flows_candidate_decisions_total[${RI}]))`, 'decision {{status}}'],
    ['max(paver_flows_registered)', 'flows registered'],
  ],
  { x: 12 },
);
ts('LLM steps saved/s (auto-seq)', 'ops', [
  [`sum(rate(paver_autoseq_llm_steps_saved_total[${RI}]))`, 'steps saved'],
  [`sum by (event_type) (rate(paver_autoseq_decisions_total[${RI}]))`, 'decisions {{event_type}}'],
]);
ts(
  'Flow selections/s by path and sequencer violations/s',
  'ops',
  [
    [`sum by (path) (rate(paver_flows_selections_total[${RI}]))`, 'selection {{path}}'],
    [`sum by (policy) (rate(paver_sequencer_violations_total[${RI}]))`, 'violation {{policy}}'],
  ],
  { x: 12 },
);

row('Sequencer');
ts('Session-state reads/s by source', 'ops', [
  [`sum by (source) (rate(paver_sequencer_state_reads_total[${RI}]))`, '{{source}}'],
]);
ts(
  'Session-state cache hit ratio',
  'percentunit',
  [
    [
      `sum(rate(paver_sequencer_state_reads_total{source="cache"}[${RI}])) / sum(rate(paver_sequencer_state_reads_total[${RI}]))`,
      'cache hits',
    ],
    [`avg(paver_sequencer_epoch_tracking)`, 'instances whose loss check is tracked'],
  ],
  {
    x: 12,
    description:
      'Allowed-tools reads answered from the in-process cache (no session GET), and the share of instances whose Redis-loss check is vouched for by client-side tracking (paver_sequencer_epoch_tracking): together, reads with no Redis round trip at all.',
  },
);

row('OpenTelemetry ingest');
ts(
  'OTLP messages/s by encoding and outcome',
  'ops',
  [[`sum by (encoding, outcome) (rate(paver_ingest_messages_total[${RI}]))`, '{{encoding}} {{outcome}}']],
  { description: 'decoded, or the dead-letter reason (undecodable, invalid, oversize).' },
);
ts(
  'Spans/s by outcome',
  'ops',
  [[`sum by (outcome) (rate(paver_ingest_spans_total[${RI}]))`, '{{outcome}}']],
  {
    x: 12,
    stack: true,
    description:
      'One outcome per span read, when read (they add up to the spans read). tool_call: published at once (its agent span was known); pending: kept in Redis for its invoke_agent span (published later, counted then only in paver_ingest_events_total); dropped: no room left in its trace (spans or bytes), for it or for a span on its path to its agent span; late: its agent span already completed; orphan: no invoke_agent ancestor; nested, agent: not published as a tool call; other: not a GenAI tool or agent span; invalid: malformed (ids, times), left out while the rest of its request is handled.',
  },
);
ts('Tool-calls events published/s by type', 'ops', [
  [`sum by (type) (rate(paver_ingest_events_total[${RI}]))`, '{{type}}'],
]);
ts(
  'Payloads omitted and corrupt buffered spans',
  'short',
  [
    [
      `sum by (field, reason) (increase(paver_ingest_payloads_omitted_total[${RI}]))`,
      'omitted {{field}} {{reason}}',
    ],
    [`sum(increase(paver_ingest_corrupt_state_total[${RI}]))`, 'corrupt state'],
  ],
  {
    x: 12,
    description:
      'Tool arguments or results left out of events (INGEST_MAX_PAYLOAD_BYTES, not an object, not JSON), and span records in Redis that failed validation.',
  },
);

row('Process');
ts('Resident memory', 'bytes', [[`max by (service) (process_resident_memory_bytes{${svc}})`, '{{service}}']]);
ts(
  'Event-loop lag p99',
  's',
  [[`max by (service) (nodejs_eventloop_lag_p99_seconds{${svc}})`, '{{service}}']],
  {
    x: 12,
  },
);

const dashboard = {
  uid: 'paver-overview',
  title: 'Paver',
  description:
    'Paver services: throughput, lag, dead letters, latency, flow candidates, LLM steps saved, sequencer state reads and OpenTelemetry ingest.',
  tags: ['paver', 'kafka'],
  schemaVersion: 39,
  version: 1,
  editable: true,
  graphTooltip: 1,
  time: { from: 'now-1h', to: 'now' },
  refresh: '30s',
  templating: {
    list: [
      {
        name: 'datasource',
        label: 'Data source',
        type: 'datasource',
        query: 'prometheus',
        current: {},
        hide: 0,
      },
      {
        name: 'service',
        label: 'Service',
        type: 'query',
        datasource: ds,
        query: { query: 'label_values(paver_events_consumed_total, service)', refId: 'service' },
        definition: 'label_values(paver_events_consumed_total, service)',
        includeAll: true,
        multi: true,
        allValue: '.+',
        current: { text: 'All', value: '$__all' },
        refresh: 2,
      },
    ],
  },
  annotations: { list: [] },
  panels,
};
const json = JSON.stringify(dashboard, null, 2) + '\n';
if (process.argv.includes('--stdout')) process.stdout.write(json);
else writeFileSync(new URL('../deploy/grafana/dashboards/paver.json', import.meta.url), json);
