import { catalogKey, toolCatalogRecordV1, type ToolCatalogRecord } from '../../../../schemas/index.js';
import { zodParser, type RuntimeDeps } from '../../../../shared/kafka/runner.js';
import {
  createTableFeed,
  TableRejection,
  type TableFeed,
  type TablePlace,
} from '../../../../shared/kafka/table-feed.js';
import { CatalogError, type Catalog } from '../core/catalog.js';

type FeedRecord = ToolCatalogRecord | { kind: 'tombstone'; key: string | null };

/** `tenant/agent/tool/NAME` → the tool it names (parts URI-encoded); anything else is not a tool key. */
export function parseToolKey(
  key: string | null,
): { tenant_id: string; agent_id: string; name: string } | null {
  const parts = key?.split('/');
  if (parts?.length !== 4 || parts[2] !== 'tool') return null;
  try {
    const [tenant_id, agent_id, , name] = parts.map(decodeURIComponent) as [string, string, string, string];
    return { tenant_id, agent_id, name };
  } catch {
    return null;
  }
}

/** `tenant/agent/policy` → the agent whose policy it keys (parts URI-encoded); anything else: null. */
export function parsePolicyKey(key: string | null): { tenant_id: string; agent_id: string } | null {
  const parts = key?.split('/');
  if (parts?.length !== 3 || parts[2] !== 'policy') return null;
  try {
    return { tenant_id: decodeURIComponent(parts[0]!), agent_id: decodeURIComponent(parts[1]!) };
  } catch {
    return null;
  }
}

/** The key a record must carry: the one its tombstone (and compaction) replaces it under. */
const ownKey = (r: ToolCatalogRecord): string =>
  r.kind === 'policy'
    ? catalogKey(r.tenant_id, r.agent_id, 'policy')
    : catalogKey(r.tenant_id, r.agent_id, 'tool', r.kind === 'tool' ? r.tool.name : r.name);

function keyIsOwn(r: ToolCatalogRecord, key: string | null): boolean {
  if (r.kind === 'policy') {
    const k = parsePolicyKey(key);
    return k !== null && k.tenant_id === r.tenant_id && k.agent_id === r.agent_id;
  }
  const k = parseToolKey(key);
  const name = r.kind === 'tool' ? r.tool.name : r.name;
  return k !== null && k.tenant_id === r.tenant_id && k.agent_id === r.agent_id && k.name === name;
}

/**
 * One record of the compacted catalog topic applied to the catalog in force, or refused (`TableRejection`:
 * dead-lettered, nothing changed). The catalog in force must be what a restart reads back from the topic, so:
 * - a tombstone on a policy key withdraws the agent's policy (back to the catalog file's, else the default: off).
 *   It was refused, and the policy stayed in force (`auto_seq_execute` included) until the next restart, when
 *   compaction had dropped it;
 * - a record is applied only under its own key (any URI encoding that decodes to it). A record under another
 *   key (another tool's, another agent's, `x`) was applied while its tombstone removed something else, and
 *   compaction kept or dropped it apart from the records it replaced (other keys land on other partitions,
 *   read in no set order at a restart).
 */
export function applyCatalogRecord(catalog: Catalog, v: FeedRecord, key: string | null): void {
  try {
    if (v.kind === 'tombstone') {
      const tool = parseToolKey(v.key);
      if (tool) return catalog.apply({ schema_version: 1, kind: 'tool_removed', ...tool });
      const policy = parsePolicyKey(v.key);
      if (policy) return catalog.removePolicy(policy.tenant_id, policy.agent_id);
      throw new CatalogError(
        `tombstone key '${v.key}' must be tenant/agent/tool/NAME or tenant/agent/policy (parts URI-encoded)`,
      );
    }
    if (!keyIsOwn(v, key))
      throw new CatalogError(`key '${key}' is not the record's own key '${ownKey(v)}' (parts URI-encoded)`);
    catalog.apply(v);
  } catch (err) {
    throw err instanceof CatalogError ? new TableRejection(err.message) : err;
  }
}

/** The compacted tool-catalog topic applied to the in-memory catalog; a tombstone removes a tool or a policy. */
export function createCatalogFeed(catalog: Catalog, place: TablePlace, runtime: RuntimeDeps): TableFeed {
  return createTableFeed<FeedRecord>(
    {
      ...place,
      service: 'autoseq',
      parse: zodParser(toolCatalogRecordV1),
      tombstone: (key) => ({ kind: 'tombstone', key }),
      apply: (v, key) => applyCatalogRecord(catalog, v, key),
    },
    runtime,
  );
}
