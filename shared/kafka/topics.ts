import { setTimeout as sleep } from 'node:timers/promises';
import type { Admin, ConfigResourceTypes } from 'kafkajs';
import type { CommonEnv } from '../config.js';
import { errorMessage } from '../errors.js';

export interface TopicSpec {
  topic: string;
  compacted?: boolean;
  partitions?: number;
  /** A compacted topic whose records also expire (`compact,delete`): a key not written for this long goes. */
  retentionMs?: number;
}

/** The topics of DESIGN.md; compacted ones hold latest-state-per-key records. */
export function paverTopics(env: CommonEnv, extra: TopicSpec[] = []): TopicSpec[] {
  return [
    { topic: env.PAVER_TOPIC_TOOL_CALLS },
    { topic: env.PAVER_TOPIC_FLOW_CANDIDATES, compacted: true },
    { topic: env.PAVER_TOPIC_NEXT_ACTIONS },
    { topic: env.PAVER_TOPIC_SEQUENCE_STATE },
    { topic: env.PAVER_TOPIC_FLOW_SELECTIONS },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS },
    ...extra,
  ];
}

/**
 * Creates the missing topics (existing ones are left as they are: their partition count is the operator's),
 * then waits until every partition of every topic answers on its leader.
 */
export async function ensureTopics(
  admin: Admin,
  specs: TopicSpec[],
  defaults: { partitions: number; replicationFactor?: number | undefined },
  readyTimeoutMs = 60_000,
): Promise<string[]> {
  const existing = new Set(await admin.listTopics());
  const missing = specs.filter((s) => !existing.has(s.topic));
  if (missing.length > 0) {
    try {
      await createMissing(admin, missing, defaults);
    } catch (err) {
      // Several services start at once and create the same topics: what matters is that they exist now.
      const now = new Set(await admin.listTopics());
      if (missing.some((s) => !now.has(s.topic))) throw err;
    }
  }
  // Also for topics that existed: another service may have created them a moment ago.
  await waitForTopicsReady(
    admin,
    specs.map((s) => s.topic),
    readyTimeoutMs,
  );
  return missing.map((s) => s.topic);
}

/**
 * Waits until each partition has a leader that serves it. kafkajs's `waitForLeaders` trusts the metadata, but on
 * a fresh KRaft broker the metadata names a leader before that leader hosts the partition, and the first
 * produce or join then fails with "This server does not host this topic-partition". A ListOffsets on every
 * partition (what `fetchTopicOffsets` sends to each leader) is the proof.
 */
export async function waitForTopicsReady(admin: Admin, topics: string[], timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown = null;
  for (;;) {
    try {
      const meta = await admin.fetchTopicMetadata({ topics });
      const leaderless = meta.topics.some(
        (t) =>
          t.partitions.length === 0 || t.partitions.some((p) => p.leader < 0 || p.partitionErrorCode !== 0),
      );
      if (!leaderless) {
        for (const t of topics) await admin.fetchTopicOffsets(t);
        return;
      }
      last = new Error('a partition has no leader yet');
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`topics not ready after ${timeoutMs} ms: ${errorMessage(last)}`, { cause: last });
    await sleep(250);
  }
}

async function createMissing(
  admin: Admin,
  missing: TopicSpec[],
  defaults: { partitions: number; replicationFactor?: number | undefined },
) {
  await admin.createTopics({
    waitForLeaders: true,
    topics: missing.map((s) => ({
      topic: s.topic,
      numPartitions: s.partitions ?? defaults.partitions,
      // Absent: the broker's default.replication.factor.
      ...(defaults.replicationFactor !== undefined ? { replicationFactor: defaults.replicationFactor } : {}),
      configEntries: s.compacted
        ? [
            { name: 'cleanup.policy', value: s.retentionMs ? 'compact,delete' : 'compact' },
            { name: 'min.compaction.lag.ms', value: '60000' },
            // Kafka compacts only closed segments: they roll every 10 minutes (or as often as records expire), so
            // a topic written on every batch holds about one record per key, not a day of writes.
            ...(s.retentionMs
              ? [
                  { name: 'retention.ms', value: String(s.retentionMs) },
                  { name: 'segment.ms', value: String(Math.min(s.retentionMs, 600_000)) },
                ]
              : []),
          ]
        : [],
    })),
  });
}

/**
 * Why an existing topic cannot keep the latest record per key, as the specs marked `compacted` need (the
 * state copies a Redis loss is restored from, the candidates table), or null when it can: a `delete` topic
 * with a finite retention (by age or by size) drops a key's only record once it is that old or that far
 * back, and the restore then brings back less, silently. One kept forever loses nothing (it grows), nor does
 * one with no cleanup at all (an empty policy).
 */
export function compactionProblem(spec: TopicSpec, config: Readonly<Record<string, string>>): string | null {
  const policy = (config['cleanup.policy'] ?? 'delete')
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p !== '');
  if (policy.includes('compact') || !policy.includes('delete')) return null;
  const ms = Number(config['retention.ms'] ?? '604800000');
  const bytes = Number(config['retention.bytes'] ?? '-1');
  if (!(ms >= 0) && !(bytes >= 0)) return null;
  const limits = [ms >= 0 ? `retention.ms=${ms}` : '', bytes >= 0 ? `retention.bytes=${bytes}` : '']
    .filter(Boolean)
    .join(' and ');
  const want = spec.retentionMs ? 'compact,delete' : 'compact';
  return (
    `topic ${spec.topic} has cleanup.policy=delete and ${limits}: records past that go even when they are a ` +
    `key's latest, which this topic must keep; set cleanup.policy=${want} ` +
    `(kafka-configs.sh --alter --entity-type topics --entity-name ${spec.topic} --add-config ` +
    `cleanup.policy=[${want}])`
  );
}

/**
 * Why a `compact,delete` topic keeps a key's records for less than the service asks (`spec.retentionMs`), or null.
 * `ensureTopics` sets `retention.ms` only when it creates the topic: raising the setting behind it later (the
 * sequencer's SEQUENCER_SESSION_TTL_MS) leaves the topic dropping a live session's only record, which a Redis loss
 * then does not restore. A warning, not a refusal: the topic may be shorter on purpose, and it loses nothing
 * while Redis keeps its data.
 */
export function retentionShortfall(spec: TopicSpec, config: Readonly<Record<string, string>>): string | null {
  if (!spec.retentionMs) return null;
  const policy = (config['cleanup.policy'] ?? 'delete').split(',').map((p) => p.trim());
  if (!policy.includes('delete')) return null;
  const ms = Number(config['retention.ms'] ?? '604800000');
  if (!(ms >= 0) || ms >= spec.retentionMs) return null;
  return (
    `topic ${spec.topic} keeps records retention.ms=${ms} but this service asks ${spec.retentionMs} ms: a key ` +
    `not written for ${ms} ms goes, and a restore after a Redis loss brings back less; raise it ` +
    `(kafka-configs.sh --alter --entity-type topics --entity-name ${spec.topic} --add-config ` +
    `retention.ms=${spec.retentionMs})`
  );
}

/**
 * kafkajs's `ConfigResourceTypes.TOPIC` (the protocol's resource type 2): the enum is not among the names Node
 * finds in kafkajs's CommonJS exports, so an ESM import of it fails at load time (the type is imported only).
 */
const TOPIC_RESOURCE = 2 as ConfigResourceTypes;

/**
 * `compactionProblem` for every existing topic of `specs` marked `compacted` (one DescribeConfigs call);
 * `retentionShortfall`s go to `warn`.
 */
export async function compactionProblems(
  admin: Admin,
  specs: readonly TopicSpec[],
  warn: (shortfall: string) => void = () => undefined,
): Promise<string[]> {
  const existing = new Set(await admin.listTopics());
  const targets = specs.filter((s) => s.compacted && existing.has(s.topic));
  if (targets.length === 0) return [];
  const res = await admin.describeConfigs({
    includeSynonyms: false,
    resources: targets.map((s) => ({
      type: TOPIC_RESOURCE,
      name: s.topic,
      configNames: ['cleanup.policy', 'retention.ms', 'retention.bytes'],
    })),
  });
  const problems: string[] = [];
  for (const spec of targets) {
    const r = res.resources.find((x) => x.resourceName === spec.topic);
    if (!r) continue;
    const config: Record<string, string> = {};
    for (const e of r.configEntries) if (e.configValue !== null) config[e.configName] = e.configValue;
    const problem = compactionProblem(spec, config);
    if (problem) problems.push(problem);
    const shortfall = problem ? null : retentionShortfall(spec, config);
    if (shortfall) warn(shortfall);
  }
  return problems;
}
