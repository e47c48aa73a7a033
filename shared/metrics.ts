import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/** The runtime metrics every service exports; services add domain metrics on the same registry. */
export interface RuntimeMetrics {
  registry: Registry;
  eventsConsumed: Counter<'topic' | 'outcome'>;
  processingSeconds: Histogram<'topic' | 'outcome'>;
  deadLetters: Counter<'reason'>;
  consumerLag: Gauge<'topic' | 'partition'>;
  oldestUnprocessedAge: Gauge<'topic' | 'partition'>;
  retries: Counter<'code'>;
  consumerCrashes: Counter<'restart'>;
  rebalances: Counter;
  paused: Gauge;
  published: Counter<'topic'>;
  oversizeOutputs: Counter<'topic' | 'outcome'>;
  keyMismatches: Counter<'topic'>;
  markerCommitFailures: Counter<'topic'>;
}

export function createMetrics(service: string, registry = new Registry()): RuntimeMetrics {
  registry.setDefaultLabels({ service });
  collectDefaultMetrics({ register: registry });
  const r = [registry];
  return {
    registry,
    eventsConsumed: new Counter({
      name: 'paver_events_consumed_total',
      help: 'Messages consumed, by outcome (processed, dead_lettered, ignored).',
      labelNames: ['topic', 'outcome'],
      registers: r,
    }),
    processingSeconds: new Histogram({
      name: 'paver_batch_processing_seconds',
      help: 'Time to process one consumed batch, from decode to committed effects (outcome: ok, failed, stopped: cut short by a stop or a rebalance).',
      labelNames: ['topic', 'outcome'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: r,
    }),
    deadLetters: new Counter({
      name: 'paver_dead_letters_total',
      help: 'Messages written to the dead-letter topic, by reason.',
      labelNames: ['reason'],
      registers: r,
    }),
    consumerLag: new Gauge({
      name: 'paver_consumer_lag',
      help: "Messages behind the log end per assigned partition: high watermark minus the group's committed offset, polled every PAVER_LAG_POLL_MS.",
      labelNames: ['topic', 'partition'],
      registers: r,
    }),
    oldestUnprocessedAge: new Gauge({
      name: 'paver_consumer_oldest_unprocessed_age_seconds',
      help: 'Age of the oldest unprocessed message per assigned partition (now minus its timestamp; a lower bound until it is fetched), 0 when caught up.',
      labelNames: ['topic', 'partition'],
      registers: r,
    }),
    retries: new Counter({
      name: 'paver_retries_total',
      help: 'Batch retries after transient errors, by error code.',
      labelNames: ['code'],
      registers: r,
    }),
    consumerCrashes: new Counter({
      name: 'paver_consumer_crashes_total',
      help: 'Consumer crashes reported by the Kafka client, by whether it restarted.',
      labelNames: ['restart'],
      registers: r,
    }),
    rebalances: new Counter({
      name: 'paver_consumer_rebalances_total',
      help: 'Consumer group joins (each follows a rebalance).',
      registers: r,
    }),
    paused: new Gauge({
      name: 'paver_consumer_paused',
      help: '1 while consumption is paused for backpressure (a dependency is not ready).',
      registers: r,
    }),
    published: new Counter({
      name: 'paver_records_published_total',
      help: 'Records produced to output topics.',
      labelNames: ['topic'],
      registers: r,
    }),
    keyMismatches: new Counter({
      name: 'paver_input_key_mismatches_total',
      help: "Input records whose Kafka key is not the one the topic's contract asks for (the tool-calls topic: the event's session_id). Still processed; per-session order and per-partition state assume the key.",
      labelNames: ['topic'],
      registers: r,
    }),
    markerCommitFailures: new Counter({
      name: 'paver_marker_commit_failures_total',
      help: 'Failed commits past records no consumer is given (transaction markers, aborted records) at a partition end; each is tried again at the next fetch or batch.',
      labelNames: ['topic'],
      registers: r,
    }),
    oversizeOutputs: new Counter({
      name: 'paver_outputs_oversize_total',
      help: 'Output records over PAVER_MAX_OUTPUT_BYTES, by what was done: trimmed (made to fit) or dropped.',
      labelNames: ['topic', 'outcome'],
      registers: r,
    }),
  };
}
