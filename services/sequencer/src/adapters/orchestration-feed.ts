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

/** The one key an agent's records and tombstone carry: `tenant/agent`, each part URI-encoded. */
export const agentKey = (tenant: string, agent: string): string =>
  `${encodeURIComponent(tenant)}/${encodeURIComponent(agent)}`;

/**
 * One record of the topic applied to the orchestrations in force, or refused (`TableRejection`: dead-lettered).
 * A key other than the record's own `agentKey` is refused, whatever it parses to: compaction keeps one record per
 * key, so an agent under two keys keeps both, and a tombstone can only remove what its own key names (a record
 * under a key no tombstone can take back, such as an unencoded '/', would stay in force for ever).
 */
export function applyOrchestrationRecord(config: Orchestrations, v: FeedRecord, key: string | null): void {
  if ('kind' in v) {
    const scope = parseAgentKey(v.key);
    if (!scope || agentKey(scope.tenant, scope.agent) !== v.key)
      throw new TableRejection(
        `tombstone key '${v.key}' is not tenant_id/agent_id with each part URI-encoded (encodeURIComponent)`,
      );
    config.delete(scope.tenant, scope.agent);
    return;
  }
  const own = agentKey(v.tenant_id, v.agent_id);
  if (key !== own)
    throw new TableRejection(
      `key '${key}' is not the record's own key '${own}' (tenant_id/agent_id, each part URI-encoded)`,
    );
  try {
    config.set(v);
  } catch (err) {
    throw err instanceof ConfigError ? new TableRejection(err.message) : err;
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
      apply: (v, key) => applyOrchestrationRecord(config, v, key),
    },
    runtime,
  );
}
