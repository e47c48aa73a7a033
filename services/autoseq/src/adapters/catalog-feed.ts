import { toolCatalogRecordV1, type ToolCatalogRecord } from '../../../../schemas/index.js';
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

/** The compacted tool-catalog topic applied to the in-memory catalog; a tombstone on a tool key removes the tool. */
export function createCatalogFeed(catalog: Catalog, place: TablePlace, runtime: RuntimeDeps): TableFeed {
  return createTableFeed<FeedRecord>(
    {
      ...place,
      service: 'autoseq',
      parse: zodParser(toolCatalogRecordV1),
      tombstone: (key) => ({ kind: 'tombstone', key }),
      apply(v) {
        try {
          if (v.kind === 'tombstone') {
            const ref = parseToolKey(v.key);
            if (!ref) throw new CatalogError('tombstone key must be tenant/agent/tool/NAME');
            catalog.apply({ schema_version: 1, kind: 'tool_removed', ...ref });
          } else catalog.apply(v);
        } catch (err) {
          throw err instanceof CatalogError ? new TableRejection(err.message) : err;
        }
      },
    },
    runtime,
  );
}
