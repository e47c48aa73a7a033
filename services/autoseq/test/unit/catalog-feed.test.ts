import { describe, expect, it } from 'vitest';
import {
  catalogKey,
  catalogPolicyV1,
  catalogToolV1,
  type ToolCatalogRecord,
  type ToolCallEvent,
} from '../../../../schemas/index.js';
import { sha256 } from '../../../../shared/hash.js';
import { TableRejection } from '../../../../shared/kafka/table-feed.js';
import { applyCatalogRecord } from '../../src/adapters/catalog-feed.js';
import { Catalog, loadCatalogFile } from '../../src/core/catalog.js';
import { decide, DEFAULT_OPTIONS, newTaskState } from '../../src/core/decide.js';
import { SchemaCompiler } from '../../src/core/schema-compiler.js';

const schema = {
  type: 'object',
  properties: { route: { type: 'string' } },
  required: ['route'],
};
const toolRec = (name: string, tenant = 'default'): ToolCatalogRecord => ({
  schema_version: 1,
  kind: 'tool',
  tenant_id: tenant,
  agent_id: 'default',
  tool: catalogToolV1.parse({
    name,
    args_schema: schema,
    side_effects: 'read',
    auto_seq: true,
    auto_seq_execute: true,
  }),
});
const policyRec = (tenant = 'default'): ToolCatalogRecord => ({
  schema_version: 1,
  kind: 'policy',
  tenant_id: tenant,
  agent_id: 'default',
  policy: catalogPolicyV1.parse({ auto_seq_enabled: true, auto_seq_execute: true }),
});
const tombstone = (key: string) => ({ kind: 'tombstone' as const, key });
const event = (tenant = 'default'): ToolCallEvent => ({
  type: 'tool_call',
  event_id: `e-${Math.random()}`,
  ts: 1,
  tenant_id: tenant,
  agent_id: 'default',
  session_id: 's',
  task_id: 't',
  step: 0,
  tool: 'triage',
  observation: { route: 'docs' },
});
const decision = (c: Catalog, tenant = 'default') =>
  decide(event(tenant), c, newTaskState(), DEFAULT_OPTIONS, sha256).records[0]!;

describe('catalog topic records and tombstones (the catalog in force is what a restart reads back)', () => {
  it("a tombstone on an agent's policy key withdraws the policy: auto-seq off again, as after a restart", () => {
    const c = new Catalog(new SchemaCompiler());
    applyCatalogRecord(c, policyRec(), catalogKey('default', 'default', 'policy'));
    applyCatalogRecord(c, toolRec('init_docs'), catalogKey('default', 'default', 'tool', 'init_docs'));
    expect(decision(c)).toMatchObject({ event_type: 'auto_seq_detected_unique', execute: true });
    // Before: refused ("tombstone key must be tenant/agent/tool/NAME"), and the policy stayed in force.
    applyCatalogRecord(c, tombstone(catalogKey('default', 'default', 'policy')), null);
    expect(decision(c)).toMatchObject({ event_type: 'auto_seq_skipped', reason: 'disabled' });
  });

  it("a policy tombstone leaves the catalog file's policy for that agent, which a restart would load", () => {
    const c = loadCatalogFile(
      {
        agents: [
          {
            policy: { auto_seq_enabled: true },
            tools: [{ name: 'init_docs', args_schema: schema, side_effects: 'read', auto_seq: true }],
          },
        ],
      },
      new SchemaCompiler(),
    );
    applyCatalogRecord(c, policyRec(), catalogKey('default', 'default', 'policy'));
    expect(decision(c)).toMatchObject({ execute: false }); // the tool is not auto_seq_execute
    applyCatalogRecord(c, tombstone(catalogKey('default', 'default', 'policy')), null);
    expect(decision(c)).toMatchObject({ event_type: 'auto_seq_detected_unique', execute: false });
  });

  it('a record under a key that is not its own is refused: its tombstone would remove something else', () => {
    const c = new Catalog(new SchemaCompiler());
    applyCatalogRecord(c, policyRec('acme'), catalogKey('acme', 'default', 'policy'));
    // Another agent's key, another tool's key, no key, a policy under a tool key.
    for (const [rec, key] of [
      [toolRec('init_docs', 'acme'), catalogKey('default', 'default', 'tool', 'init_docs')],
      [toolRec('init_docs', 'acme'), catalogKey('acme', 'default', 'tool', 'other')],
      [toolRec('init_docs', 'acme'), null],
      [policyRec('acme'), catalogKey('acme', 'default', 'tool', 'x')],
    ] as const)
      expect(() => applyCatalogRecord(c, rec, key)).toThrow(TableRejection);
    expect(decision(c, 'acme')).toMatchObject({ event_type: 'auto_seq_detected_none' });
    // Under its own key (another encoding that decodes to it is the same key): applied, and its tombstone removes it.
    applyCatalogRecord(c, toolRec('init_docs', 'acme'), 'acme/default/tool/init%5Fdocs');
    expect(decision(c, 'acme')).toMatchObject({ event_type: 'auto_seq_detected_unique' });
    applyCatalogRecord(c, tombstone(catalogKey('acme', 'default', 'tool', 'init_docs')), null);
    expect(decision(c, 'acme')).toMatchObject({ event_type: 'auto_seq_detected_none' });
    expect(() => applyCatalogRecord(c, tombstone('acme/default'), null)).toThrow(TableRejection);
  });
});

describe('compiled schemas are kept while a tool uses them', () => {
  it('a tool replaced again and again with new schemas holds one; a removed tool none; a bad one leaves none', () => {
    const compiler = new SchemaCompiler();
    const c = new Catalog(compiler);
    // An enum of current values, as a catalog publisher refreshes it: a new schema each time.
    const withEnum = (i: number): ToolCatalogRecord => {
      const r = toolRec('pick');
      if (r.kind !== 'tool') throw new Error('a tool record');
      return {
        ...r,
        tool: { ...r.tool, args_schema: { ...schema, properties: { route: { enum: [`v${i}`] } } } },
      };
    };
    for (let i = 0; i < 200; i++)
      applyCatalogRecord(c, withEnum(i), catalogKey('default', 'default', 'tool', 'pick'));
    // Before: 200, every version compiled and kept for the life of the process.
    expect(compiler.size).toBe(1);
    applyCatalogRecord(c, policyRec(), catalogKey('default', 'default', 'policy'));
    expect(decision(c)).toMatchObject({ event_type: 'auto_seq_detected_none' });
    applyCatalogRecord(c, toolRec('init_docs'), catalogKey('default', 'default', 'tool', 'init_docs'));
    expect(compiler.size).toBe(2);
    // Two tools of one schema share its entry: one going leaves it to the other.
    applyCatalogRecord(c, toolRec('index_docs'), catalogKey('default', 'default', 'tool', 'index_docs'));
    applyCatalogRecord(c, tombstone(catalogKey('default', 'default', 'tool', 'init_docs')), null);
    expect(compiler.size).toBe(2);
    expect(decision(c)).toMatchObject({ event_type: 'auto_seq_detected_unique', tool: 'index_docs' });
    applyCatalogRecord(c, tombstone(catalogKey('default', 'default', 'tool', 'index_docs')), null);
    applyCatalogRecord(c, tombstone(catalogKey('default', 'default', 'tool', 'pick')), null);
    expect(compiler.size).toBe(0);
    const bad = toolRec('bad');
    if (bad.kind === 'tool') bad.tool = { ...bad.tool, args_schema: { type: 'no-such-type' } };
    expect(() => applyCatalogRecord(c, bad, catalogKey('default', 'default', 'tool', 'bad'))).toThrow(
      TableRejection,
    );
    expect(compiler.size).toBe(0);
  });
});
