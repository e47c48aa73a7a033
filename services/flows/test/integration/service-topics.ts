import { createTopics } from '../../../../test/helpers/kafka.js';

/**
 * The flows service's topics for one test's environment: the tool-calls topic (`partitions`: one when the live
 * service must see the stream in file order, as the replay does), candidates, selections, dead letters, and the
 * compacted flows topic with its candidates' state topic.
 */
export async function createFlowsTopics(env: Record<string, string>, partitions?: number): Promise<void> {
  await createTopics([
    { topic: env.PAVER_TOPIC_TOOL_CALLS!, ...(partitions ? { partitions } : {}) },
    { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
    { topic: env.PAVER_TOPIC_FLOW_SELECTIONS! },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    { topic: env.PAVER_TOPIC_FLOWS!, compacted: true },
    { topic: `${env.PAVER_TOPIC_FLOWS!}.state`, compacted: true },
  ]);
}
