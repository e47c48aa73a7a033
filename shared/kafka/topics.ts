import type { Admin } from 'kafkajs';
import type { CommonEnv } from '../config.js';

export interface TopicSpec {
  topic: string;
  compacted?: boolean;
  partitions?: number;
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

/** Creates the missing topics; existing ones are left as they are (their partition count is the operator's). */
export async function ensureTopics(
  admin: Admin,
  specs: TopicSpec[],
  defaults: { partitions: number; replicationFactor: number },
): Promise<string[]> {
  const existing = new Set(await admin.listTopics());
  const missing = specs.filter((s) => !existing.has(s.topic));
  if (missing.length === 0) return [];
  try {
    await createMissing(admin, missing, defaults);
  } catch (err) {
    // Several services start at once and create the same topics: what matters is that they exist now.
    const now = new Set(await admin.listTopics());
    if (missing.some((s) => !now.has(s.topic))) throw err;
  }
  return missing.map((s) => s.topic);
}

async function createMissing(
  admin: Admin,
  missing: TopicSpec[],
  defaults: { partitions: number; replicationFactor: number },
) {
  await admin.createTopics({
    waitForLeaders: true,
    topics: missing.map((s) => ({
      topic: s.topic,
      numPartitions: s.partitions ?? defaults.partitions,
      replicationFactor: defaults.replicationFactor,
      configEntries: s.compacted
        ? [
            { name: 'cleanup.policy', value: 'compact' },
            { name: 'min.compaction.lag.ms', value: '60000' },
          ]
        : [],
    })),
  });
}
