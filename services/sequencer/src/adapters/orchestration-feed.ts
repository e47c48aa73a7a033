import { orchestrationRecordV1, type OrchestrationRecord } from '../../../../schemas/index.js';
import { zodParser, type RuntimeDeps } from '../../../../shared/kafka/runner.js';
import {
  createTableFeed,
  TableRejection,
  type TableFeed,
  type TablePlace,
} from '../../../../shared/kafka/table-feed.js';
import { ConfigError, type Orchestrations } from '../core/orchestration.js';

type FeedRecord = OrchestrationRecord | { kind: 'tombstone'; key: string | null };

/** `tenant/agent` (URI-encoded parts) → the scope; null for anything else. */
export function parseAgentKey(key: string | null): { tenant: string; agent: string } | null {
  const parts = key?.split('/');
  if (parts?.length !== 2) return null;
  try {
    return { tenant: decodeURIComponent(parts[0]!), agent: decodeURIComponent(parts[1]!) };
  } catch {
    return null;
  }
}

/**
 * The compacted orchestration topic applied to the orchestrations in force: a record replaces one agent's
 * (all of it compiles, or the record is dead-lettered and the previous one stays); a tombstone removes it.
 */
export function createOrchestrationFeed(
  config: Orchestrations,
  place: TablePlace,
  runtime: RuntimeDeps,
): TableFeed {
  return createTableFeed<FeedRecord>(
    {
      ...place,
      service: 'sequencer',
      parse: zodParser(orchestrationRecordV1),
      tombstone: (key) => ({ kind: 'tombstone', key }),
      apply(v, key) {
        if ('kind' in v) {
          const scope = parseAgentKey(v.key);
          if (!scope) throw new TableRejection('tombstone key must be tenant_id/agent_id');
          return config.delete(scope.tenant, scope.agent);
        }
        const scope = parseAgentKey(key);
        if (scope && (scope.tenant !== v.tenant_id || scope.agent !== v.agent_id))
          throw new TableRejection(`key '${key}' does not match the record's tenant_id/agent_id`);
        try {
          config.set(v);
        } catch (err) {
          throw err instanceof ConfigError ? new TableRejection(err.message) : err;
        }
      },
    },
    runtime,
  );
}
