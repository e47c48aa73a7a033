import { flowRegistryRecordV1, type FlowRegistryRecord } from '../../../../schemas/index.js';
import { zodParser, type RuntimeDeps } from '../../../../shared/kafka/runner.js';
import { createTableFeed, type TableFeed, type TablePlace } from '../../../../shared/kafka/table-feed.js';
import type { PromptCache } from '../core/prompt.js';
import type { FlowRegistry } from '../core/registry.js';

type FeedRecord = FlowRegistryRecord | { kind: 'tombstone'; key: string | null };

/** The compacted flows topic applied to the in-memory registry; a tombstone (keyed by flow id) removes the flow. */
export function createRegistryFeed(
  registry: FlowRegistry,
  prompts: PromptCache,
  place: TablePlace,
  runtime: RuntimeDeps,
): TableFeed {
  return createTableFeed<FeedRecord>(
    {
      ...place,
      service: 'flows',
      parse: zodParser(flowRegistryRecordV1),
      tombstone: (key) => ({ kind: 'tombstone', key }),
      apply(v) {
        if ('kind' in v) {
          if (v.key) registry.remove(v.key);
          if (v.key) prompts.delete(v.key);
        } else registry.upsert(v.flow);
      },
    },
    runtime,
  );
}
