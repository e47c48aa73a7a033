import type { RegisteredFlow } from '../../../../schemas/index.js';
import type { Sink } from '../../../../shared/kafka/sink.js';

/** Writes to the compacted flows topic (PAVER_TOPIC_FLOWS), keyed by flow id: what the registry feed reads. */
export function flowsTopicWriter(sink: Pick<Sink, 'send' | 'sendRaw'>, topic: string) {
  return {
    publish: (flows: RegisteredFlow[]): Promise<void> =>
      sink.send(
        topic,
        'flows.v1',
        flows.map((flow) => ({ key: flow.id, value: { schema_version: 1, flow } })),
        'keep',
      ),
    // Tombstones: the registry feed removes the flow on every instance.
    withdraw: (ids: string[]): Promise<void> =>
      sink.sendRaw(
        topic,
        ids.map((id) => ({ key: id, value: null })),
      ),
  };
}
