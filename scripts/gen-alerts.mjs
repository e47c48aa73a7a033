// Writes Paver's Prometheus alerting rules: deploy/prometheus/alerts.yml (a rule file, which the Compose Prometheus
// loads) and deploy/k8s/alerts/prometheus-rule.yaml (the same groups as a Prometheus Operator PrometheusRule).
// Run: node scripts/gen-alerts.mjs. Edit the alerts here, never the YAML alone: test/unit/deploy-alerts.test.ts runs
// this script with --stdout (prints both instead of writing) and fails when its output differs from the committed
// files, and checks every expression against the metrics the services define.
//
// Every series carries `service` (the registry's default label, shared/metrics.ts), so each alert groups by it and
// works whatever job name or relabelling the scrape uses. Runbooks: README.md, Operations, "Alerts".
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as prettier from 'prettier';
import { stringify } from 'yaml';

/** One alert; its runbook is its entry in README.md (Operations, Alerts), under its name. */
function alert(name, { expr, for: forDuration, severity, summary, description }) {
  return {
    alert: name,
    expr,
    ...(forDuration ? { for: forDuration } : {}),
    labels: { severity },
    annotations: {
      summary,
      description,
      runbook: `README.md#alerts, ${name}`,
    },
  };
}

const groups = [
  {
    name: 'paver.consumers',
    rules: [
      alert('PaverConsumerFallingBehind', {
        expr: 'max by (service, topic) (paver_consumer_oldest_unprocessed_age_seconds) > 300',
        for: '10m',
        severity: 'warning',
        summary: '{{ $labels.service }} is more than 5 minutes behind on {{ $labels.topic }}',
        description:
          'The oldest event of {{ $labels.topic }} that {{ $labels.service }} has not processed is {{ $value | humanizeDuration }} old. Scale out (up to the partition count), or look for a slow dependency (Redis latency, broker) in the batch time.',
      }),
      alert('PaverConsumerStalled', {
        expr: 'sum by (service, topic) (paver_consumer_lag) > 0 unless sum by (service, topic) (rate(paver_events_consumed_total[10m])) > 0',
        for: '15m',
        severity: 'critical',
        summary: '{{ $labels.service }} consumes nothing from {{ $labels.topic }} while events wait',
        description:
          '{{ $labels.service }} has a lag of {{ $value }} on {{ $labels.topic }} and has consumed nothing for 10 minutes: its batches fail or it is paused. Read its logs (error lines carry a code) and paver_batch_processing_seconds_count by outcome.',
      }),
      alert('PaverBatchesFailing', {
        expr: 'sum by (service, topic) (rate(paver_batch_processing_seconds_count{outcome="failed"}[5m])) > 0 unless sum by (service, topic) (rate(paver_batch_processing_seconds_count{outcome="ok"}[5m])) > 0',
        for: '10m',
        severity: 'critical',
        summary: 'Every batch of {{ $labels.topic }} fails in {{ $labels.service }}',
        description:
          'No batch of {{ $labels.topic }} has succeeded in {{ $labels.service }} for 10 minutes, and failed ones are retried. Nothing is lost (offsets are not committed), but nothing moves: usually Redis or the broker refuses (ACL, memory, authentication). The error code is in the logs and in paver_retries_total.',
      }),
      alert('PaverDeadLetters', {
        expr: 'sum by (service, reason) (increase(paver_dead_letters_total[15m])) > 0',
        severity: 'warning',
        summary: '{{ $labels.service }} dead-lettered {{ $value }} records ({{ $labels.reason }})',
        description:
          'Records {{ $labels.service }} could not use went to the dead-letter topic with reason {{ $labels.reason }}: a producer publishes events that break the contract, or records too large. Each dead letter keeps the original bytes and headers saying why.',
      }),
      alert('PaverConsumerCrashes', {
        expr: 'sum by (service, restart) (increase(paver_consumer_crashes_total[15m])) > 0',
        severity: 'warning',
        summary: 'The Kafka consumer of {{ $labels.service }} crashed (restart={{ $labels.restart }})',
        description:
          'kafkajs reported a consumer crash in {{ $labels.service }}. With restart=false the process exits so that its supervisor starts it again; repeated crashes point at the broker (authentication, ACLs, a topic deleted).',
      }),
      alert('PaverRebalanceStorm', {
        expr: 'sum by (service) (increase(paver_consumer_rebalances_total[15m])) > 6',
        for: '15m',
        severity: 'warning',
        summary: '{{ $labels.service }} rejoins its consumer group over and over',
        description:
          '{{ $labels.service }} joined its group {{ $value }} times in 15 minutes. Instances that restart in a loop (see the crash and readiness alerts), or batches longer than the session timeout, cause this; each rebalance re-reads uncommitted work.',
      }),
      alert('PaverConsumerPaused', {
        expr: 'max by (service) (paver_consumer_paused) > 0',
        for: '10m',
        severity: 'warning',
        summary: '{{ $labels.service }} has paused consumption for 10 minutes',
        description:
          '{{ $labels.service }} pauses while a dependency is not ready (Redis unreachable, a table topic not read to its end). /readyz says which.',
      }),
      alert('PaverOutputsDropped', {
        expr: 'sum by (service, topic) (increase(paver_outputs_oversize_total{outcome="dropped"}[1h])) > 0',
        severity: 'warning',
        summary: '{{ $labels.service }} left out {{ $value }} oversized records for {{ $labels.topic }}',
        description:
          'Output records over PAVER_MAX_OUTPUT_BYTES that could not be made to fit were left out (the log names the topic and size, never the content). Raise the limit together with the topic max.message.bytes, or find the input that makes them.',
      }),
      alert('PaverInputMiskeyed', {
        expr: 'sum by (service, topic) (increase(paver_input_key_mismatches_total[1h])) > 0',
        severity: 'warning',
        summary:
          '{{ $labels.service }} read {{ $value }} records of {{ $labels.topic }} not keyed by session_id',
        description:
          'A producer keys the tool-calls topic by another field, or by nothing: one session then spreads over partitions, and its order, its sequence state and its detector tasks break (the detector ignores such events as misrouted). Key every event by its session_id.',
      }),
      alert('PaverHttpErrors', {
        expr: 'sum by (service, route) (rate(paver_http_request_duration_seconds_count{status=~"5..",route!~"/readyz|/healthz"}[5m])) > 0',
        for: '10m',
        severity: 'warning',
        summary: '{{ $labels.service }} answers {{ $labels.route }} with 5xx',
        description:
          '{{ $labels.service }} has answered {{ $labels.route }} with server errors for 10 minutes (503 while it starts, stops or rebuilds state is expected for a short time, with Retry-After).',
      }),
      alert('PaverAllowedToolsSlow', {
        expr: 'histogram_quantile(0.99, sum by (service, route, le) (rate(paver_http_request_duration_seconds_bucket{route="/sessions/:session_id/allowed-tools"}[5m]))) > 0.01',
        for: '10m',
        severity: 'warning',
        summary: 'allowed-tools p99 is over 10 ms in {{ $labels.service }}',
        description:
          'Agent runtimes wait for GET /sessions/:id/allowed-tools before each step; its p99 is {{ $value | humanizeDuration }}. Reads of cached sessions make no Redis round trip while client-side tracking holds (paver_sequencer_epoch_tracking 1); otherwise look at Redis latency.',
      }),
    ],
  },
  {
    name: 'paver.state',
    rules: [
      alert('PaverRedisStateLost', {
        expr: 'sum by (service) (increase(paver_autoseq_state_losses_total[1h])) > 0 or sum by (service) (increase(paver_sequencer_state_losses_total[1h])) > 0 or sum by (service) (increase(paver_flows_state_rebuilds_total{reason="lost"}[1h])) > 0',
        severity: 'warning',
        summary: '{{ $labels.service }} found its Redis state lost and is restoring it',
        description:
          'Redis lost data (a restart without persistence, a failover to an empty replica, a FLUSHALL). {{ $labels.service }} restores what it needs from Kafka (the detector and ingest rebuild theirs too, and count it in their rebuild metrics, which also count a first start); watch the rebuild alerts. Redis persistence (appendonly) avoids the cost.',
      }),
      alert('PaverRebuildFailing', {
        expr: 'sum by (service) (increase(paver_detector_rebuilds_total{outcome="failed"}[30m])) > 0 or sum by (service) (increase(paver_ingest_rebuilds_total{outcome="failed"}[30m])) > 0 or sum by (service) (increase(paver_flows_state_rebuilds_total{outcome="failed"}[30m])) > 0',
        severity: 'critical',
        summary: '{{ $labels.service }} fails to rebuild its state from Kafka',
        description:
          'A rebuild after a Redis loss failed in {{ $labels.service }}; it is retried, and until it succeeds the affected partitions or tables are not served. Common causes: the topic no longer holds the history (retention shorter than the state needs), or ACLs that refuse the rebuild consumer group.',
      }),
      alert('PaverRebuildTooLong', {
        expr: 'max by (service) (paver_detector_rebuilding) > 0 or max by (service) (paver_ingest_rebuilding) > 0',
        for: '30m',
        severity: 'warning',
        summary: '{{ $labels.service }} has been rebuilding state for 30 minutes',
        description:
          'A replay after a Redis loss has run for 30 minutes in {{ $labels.service }}; the partitions it rebuilds wait meanwhile (their lag grows). Long histories take long; a replay that never ends points at a topic read stalled.',
      }),
      alert('PaverRulesCopyFailing', {
        expr: 'sum by (service) (increase(paver_autoseq_rules_snapshot_flushes_total{outcome="failed"}[15m])) > 0 unless sum by (service) (increase(paver_autoseq_rules_snapshot_flushes_total{outcome="ok"}[15m])) > 0',
        for: '15m',
        severity: 'warning',
        summary: '{{ $labels.service }} cannot copy learned rules to the rules topic',
        description:
          'Learned rules changed in Redis are not reaching the compacted rules topic ({{ $labels.service }}); they are kept and retried, but a Redis loss now would lose what changed since. paver_autoseq_rules_snapshot_pending shows how much waits.',
      }),
      alert('PaverIngestCorruptState', {
        expr: 'sum by (service) (increase(paver_ingest_corrupt_state_total[1h])) > 0',
        severity: 'warning',
        summary: '{{ $labels.service }} found buffered spans in Redis it cannot read',
        description:
          'Buffered span records in Redis failed validation and were ignored: something else writes under REDIS_KEY_PREFIX, or a version downgrade. Give each deployment its own prefix.',
      }),
    ],
  },
  {
    name: 'paver.decisions',
    rules: [
      alert('PaverActiveProposalsImprecise', {
        expr: 'sum by (service, origin) (increase(paver_autoseq_proposals_total{state="active",outcome="miss"}[1h])) / sum by (service, origin) (increase(paver_autoseq_proposals_total{state="active"}[1h])) > 0.1 and sum by (service, origin) (increase(paver_autoseq_proposals_total{state="active"}[1h])) >= 50',
        for: '15m',
        severity: 'critical',
        summary: 'Over 10% of active {{ $labels.origin }} proposals missed in the last hour',
        description:
          'Active proposals are the ones runtimes may execute; {{ $value | humanizePercentage }} of them did not match what the agent did next. Learned rules demote themselves when their precision falls, so a sustained rate means agents changed behaviour faster than rules follow (a new prompt, a new tool version), or typed catalog schemas that no longer fit. GET /rules lists each rule with its precision.',
      }),
      alert('PaverRulesDemoted', {
        expr: 'sum by (service) (increase(paver_autoseq_rule_transitions_total{to="demoted"}[1h])) > 0',
        severity: 'info',
        summary: '{{ $labels.service }} demoted {{ $value }} learned rules in the last hour',
        description:
          'A proven rule stopped holding (its precision fell under AUTOSEQ_LEARN_TARGET_PRECISION, or its precision bound under AUTOSEQ_LEARN_MIN_PRECISION) and no longer acts. Expected now and then; many at once mean agent behaviour changed.',
      }),
      alert('PaverTableRecordsRejected', {
        expr: 'sum by (service) (increase(paver_autoseq_catalog_updates_total{outcome="rejected"}[15m])) > 0 or sum by (service) (increase(paver_sequencer_config_updates_total{outcome="rejected"}[15m])) > 0',
        severity: 'warning',
        summary: '{{ $labels.service }} rejected a tool catalog or orchestration record',
        description:
          'A record published to the catalog or orchestration topic failed validation, was dead-lettered, and the previous version stays in force. The dead letter says why.',
      }),
      alert('PaverFlowsModelFailing', {
        expr: 'sum by (service) (rate(paver_flows_model_calls_total{outcome=~"error|timeout"}[10m])) / sum by (service) (rate(paver_flows_model_calls_total[10m])) > 0.5',
        for: '10m',
        severity: 'warning',
        summary: 'Most flow-selection model calls fail or time out in {{ $labels.service }}',
        description:
          'While the chat model fails ({{ $value | humanizePercentage }} of calls), a selection among several candidates takes the top-ranked one (path fallback), or none with FLOWS_FAIL_OPEN (path fail_open). Check the model endpoint and its key; a call may take at most what is left of FLOWS_SELECT_BUDGET_MS.',
      }),
      alert('PaverDetectorEventsLate', {
        expr: 'sum by (service, reason) (rate(paver_detector_events_ignored_total{reason=~"late|future"}[15m])) > 0',
        for: '30m',
        severity: 'warning',
        summary: '{{ $labels.service }} ignores events as {{ $labels.reason }} for 30 minutes',
        description:
          'Events arrive behind their partition clock (late) or claim a time ahead of their Kafka record (future): a producer with a wrong clock or ts unit, or old runs published after new traffic. They are not counted in any window.',
      }),
    ],
  },
];

const ruleFile = { groups };
const prometheusRule = {
  apiVersion: 'monitoring.coreos.com/v1',
  kind: 'PrometheusRule',
  metadata: { name: 'paver', labels: { 'app.kubernetes.io/part-of': 'paver' } },
  spec: { groups },
};

const header = (what) => `# Generated by scripts/gen-alerts.mjs (${what}); edit the script, not this file.\n`;
const yaml = (doc) => stringify(doc, { lineWidth: 0, aliasDuplicateObjects: false });
const docs = {
  'deploy/prometheus/alerts.yml': header('a Prometheus rule file') + yaml(ruleFile),
  'deploy/k8s/alerts/prometheus-rule.yaml':
    header('a Prometheus Operator PrometheusRule') + yaml(prometheusRule),
};
// In the repository's own style (prettier), so that `npm run lint` and this script agree on every byte.
const files = {};
for (const [path, text] of Object.entries(docs)) {
  const filepath = fileURLToPath(new URL(`../${path}`, import.meta.url));
  files[path] = await prettier.format(text, { ...(await prettier.resolveConfig(filepath)), filepath });
}

if (process.argv.includes('--stdout')) {
  process.stdout.write(JSON.stringify(files));
} else {
  for (const [path, text] of Object.entries(files))
    writeFileSync(new URL(`../${path}`, import.meta.url), text);
}
