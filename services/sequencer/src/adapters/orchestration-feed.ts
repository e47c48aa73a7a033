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
 * A record is applied only under a key that reads as its own scope (`parseAgentKey`), as its tombstone must: a
 * key that does not read as an agent key (an unencoded '/', no '/' at all) was applied while its tombstone was
 * refused, so the agent could never be removed. Any encoding that decodes to the scope is taken (`agentKey`'s is
 * the canonical one): records already on the topic under another (`acme/agent:1`, Python's quote) stay in force
 * after an upgrade.
 */
export function applyOrchestrationRecord(config: Orchestrations, v: FeedRecord, key: string | null): void {
  if ('kind' in v) {
    const scope = parseAgentKey(v.key);
    if (!scope)
      throw new TableRejection(
        `tombstone key '${v.key}' is not tenant_id/agent_id with each part URI-encoded (encodeURIComponent)`,
      );
    config.delete(scope.tenant, scope.agent);
    return;
  }
  const scope = parseAgentKey(key);
  if (!scope || scope.tenant !== v.tenant_id || scope.agent !== v.agent_id)
    throw new TableRejection(
      `key '${key}' is not the record's own key '${agentKey(v.tenant_id, v.agent_id)}' (tenant_id/agent_id, each part URI-encoded)`,
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
