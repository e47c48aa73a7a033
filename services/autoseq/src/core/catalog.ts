import {
  catalogFileV1,
  catalogPolicyV1,
  type AgentCatalog,
  type CatalogPolicy,
  type CatalogTool,
  type ToolCatalogRecord,
} from '../../../../schemas/index.js';
import type { SchemaCompiler, Validate } from './schema-compiler.js';

export interface CompiledTool {
  spec: CatalogTool;
  validate: Validate;
  /** Top-level keys the schema requires: the pre-filter that keeps a 1,000-tool catalog fast. */
  required: readonly string[];
  /** Only an explicit `pure` or `read` is read-only; an unannotated tool is not. */
  readOnly: boolean;
  from: ReadonlySet<string> | null;
}

export class CatalogError extends Error {}

const DEFAULT_POLICY: CatalogPolicy = catalogPolicyV1.parse({});

/** The node a local `$ref` (`#/definitions/X`, `#/$defs/X`) points at in `root`; undefined for any other ref. */
function localRef(root: Record<string, unknown>, ref: string): unknown {
  if (ref !== '#' && !ref.startsWith('#/')) return undefined;
  let node: unknown = root;
  for (const part of ref === '#' ? [] : ref.slice(2).split('/')) {
    let key: string;
    try {
      key = decodeURIComponent(part).replace(/~1/g, '/').replace(/~0/g, '~');
    } catch {
      return undefined; // a malformed escape: ajv refuses the schema anyway
    }
    if (typeof node !== 'object' || node === null || !Object.hasOwn(node, key)) return undefined;
    node = (node as Record<string, unknown>)[key];
  }
  return node;
}

/**
 * Top-level keys every valid payload must hold: the schema's `required`, and those of the schemas it must also
 * satisfy (each of `allOf`, a local `$ref`). A schema generated with its model under `definitions`/`$defs` (a root
 * `$ref`, as zod-to-json-schema writes a named schema) requires its model's keys: read as requiring nothing, the
 * tool was never a candidate without `auto_seq_from`, though the observation validated.
 */
function requiredKeys(schema: Record<string, unknown>): string[] {
  const keys = new Set<string>();
  const visited = new Set<unknown>();
  const walk = (node: unknown) => {
    if (typeof node !== 'object' || node === null || visited.has(node)) return;
    visited.add(node);
    const n = node as Record<string, unknown>;
    if (Array.isArray(n.required)) for (const k of n.required) if (typeof k === 'string') keys.add(k);
    if (Array.isArray(n.allOf)) for (const sub of n.allOf) walk(sub);
    if (typeof n.$ref === 'string') walk(localRef(schema, n.$ref));
  };
  walk(schema);
  return [...keys].sort();
}

export function compileTool(compiler: SchemaCompiler, spec: CatalogTool): CompiledTool {
  let validate: Validate;
  try {
    validate = compiler.compile(spec.args_schema);
  } catch (err) {
    throw new CatalogError(
      `tool '${spec.name}': args_schema: ${err instanceof Error ? err.message : String(err)}`,
    );
  }
  const required = requiredKeys(spec.args_schema);
  return {
    spec,
    validate,
    required,
    readOnly: spec.side_effects === 'pure' || spec.side_effects === 'read',
    from: spec.auto_seq_from ? new Set(spec.auto_seq_from) : null,
  };
}

/** One agent's tools and policy, with the auto-seq tools indexed by a required key. */
export class ScopeCatalog {
  policy: CatalogPolicy = DEFAULT_POLICY;
  readonly tools = new Map<string, CompiledTool>();
  version = 0;
  private byKey: Map<string, CompiledTool[]> | null = null;
  private universal: CompiledTool[] = [];

  setTool(t: CompiledTool): void {
    this.tools.set(t.spec.name, t);
    this.changed();
  }
  removeTool(name: string): boolean {
    const had = this.tools.delete(name);
    if (had) this.changed();
    return had;
  }
  setPolicy(p: CatalogPolicy): void {
    this.policy = p;
    this.changed();
  }
  private changed() {
    this.version++;
    this.byKey = null;
  }

  /** auto-seq tools whose required keys are all present in `keys` (not yet validated, not yet gated). */
  preselect(keys: ReadonlySet<string>): CompiledTool[] {
    if (!this.byKey) {
      this.byKey = new Map();
      this.universal = [];
      for (const t of this.tools.values()) {
        if (!t.spec.auto_seq) continue;
        const first = t.required[0];
        if (first === undefined) this.universal.push(t);
        else {
          const list = this.byKey.get(first);
          if (list) list.push(t);
          else this.byKey.set(first, [t]);
        }
      }
    }
    const out = [...this.universal];
    for (const k of keys) {
      for (const t of this.byKey.get(k) ?? []) if (t.required.every((r) => keys.has(r))) out.push(t);
    }
    return out;
  }
}

const scopeId = (tenant: string, agent: string) => `${tenant}\u001f${agent}`;

/** Every agent's catalog. A change to one tool recompiles that tool only. */
export class Catalog {
  private readonly scopes = new Map<string, ScopeCatalog>();
  /** Each agent's policy as the catalog file gave it: what removing its policy record from the topic leaves. */
  private readonly filePolicies = new Map<string, CatalogPolicy>();
  constructor(private readonly compiler: SchemaCompiler) {}

  scope(tenant: string, agent: string): ScopeCatalog | undefined {
    return this.scopes.get(scopeId(tenant, agent));
  }
  private ensure(tenant: string, agent: string): ScopeCatalog {
    const id = scopeId(tenant, agent);
    let s = this.scopes.get(id);
    if (!s) this.scopes.set(id, (s = new ScopeCatalog()));
    return s;
  }

  /** A replaced or removed tool's schema is no longer in use (see `SchemaCompiler.release`). */
  private release(t: CompiledTool | undefined): void {
    if (t) this.compiler.release(t.spec.args_schema);
  }

  /** Compiles all of an agent's tools before changing anything: a bad tool leaves the agent's catalog as it was. */
  loadAgent(a: AgentCatalog): void {
    const compiled: CompiledTool[] = [];
    try {
      for (const t of a.tools) compiled.push(compileTool(this.compiler, t));
      const seen = new Set<string>();
      for (const t of compiled) {
        if (seen.has(t.spec.name))
          throw new CatalogError(`agent ${a.tenant_id}/${a.agent_id}: tool '${t.spec.name}' is listed twice`);
        seen.add(t.spec.name);
      }
    } catch (err) {
      for (const t of compiled) this.release(t);
      throw err;
    }
    const s = this.ensure(a.tenant_id, a.agent_id);
    for (const t of s.tools.values()) this.release(t);
    s.tools.clear();
    for (const t of compiled) s.setTool(t);
    s.setPolicy(a.policy);
    this.filePolicies.set(scopeId(a.tenant_id, a.agent_id), a.policy);
  }

  /**
   * The agent's policy record withdrawn from the topic (a tombstone): the policy a restart would find, the
   * catalog file's for the agent, else the default (auto-seq off).
   */
  removePolicy(tenant: string, agent: string): void {
    this.scope(tenant, agent)?.setPolicy(this.filePolicies.get(scopeId(tenant, agent)) ?? DEFAULT_POLICY);
  }

  /** A catalog-topic record; throws CatalogError (and changes nothing) when the tool's schema does not compile. */
  apply(r: ToolCatalogRecord): void {
    if (r.kind === 'tool') {
      const t = compileTool(this.compiler, r.tool);
      const s = this.ensure(r.tenant_id, r.agent_id);
      const old = s.tools.get(t.spec.name);
      s.setTool(t);
      this.release(old);
    } else if (r.kind === 'policy') this.ensure(r.tenant_id, r.agent_id).setPolicy(r.policy);
    else {
      const s = this.scope(r.tenant_id, r.agent_id);
      const old = s?.tools.get(r.name);
      if (s?.removeTool(r.name)) this.release(old);
    }
  }

  get size(): { agents: number; tools: number } {
    let tools = 0;
    for (const s of this.scopes.values()) tools += s.tools.size;
    return { agents: this.scopes.size, tools };
  }
}

/**
 * Validates a catalog file and compiles it. Errors name the agent, the tool and the field
 * (`agent default/default, tool 'uppercase': side_effects: Invalid option…`), all of them at once.
 */
export function loadCatalogFile(raw: unknown, compiler: SchemaCompiler): Catalog {
  const parsed = catalogFileV1.safeParse(raw);
  const errors: string[] = [];
  if (!parsed.success) {
    const agents = (raw as { agents?: unknown[] } | null)?.agents;
    for (const issue of parsed.error.issues.slice(0, 50)) {
      const [a, ai, t, ti, ...rest] = issue.path;
      if (a === 'agents' && typeof ai === 'number') {
        const agent = agents?.[ai] as
          { tenant_id?: unknown; agent_id?: unknown; tools?: { name?: unknown }[] } | undefined;
        const who = `agent ${String(agent?.tenant_id ?? 'default')}/${String(agent?.agent_id ?? 'default')}`;
        if (t === 'tools' && typeof ti === 'number') {
          const name = agent?.tools?.[ti]?.name;
          errors.push(
            `${who}, tool ${typeof name === 'string' ? `'${name}'` : `#${ti}`}: ${rest.map(String).join('.') || '(tool)'}: ${issue.message}`,
          );
        } else
          errors.push(
            `${who}: ${
              [t, ti, ...rest]
                .filter((p) => p !== undefined)
                .map(String)
                .join('.') || '(agent)'
            }: ${issue.message}`,
          );
      } else errors.push(`${issue.path.map(String).join('.') || '(root)'}: ${issue.message}`);
    }
    throw new CatalogError(`invalid catalog:\n  ${errors.join('\n  ')}`);
  }
  const catalog = new Catalog(compiler);
  const scopes = new Set<string>();
  for (const a of parsed.data.agents) {
    const id = scopeId(a.tenant_id, a.agent_id);
    if (scopes.has(id)) errors.push(`agent ${a.tenant_id}/${a.agent_id}: listed twice`);
    scopes.add(id);
    try {
      catalog.loadAgent(a);
    } catch (err) {
      errors.push(`agent ${a.tenant_id}/${a.agent_id}, ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  if (errors.length) throw new CatalogError(`invalid catalog:\n  ${errors.join('\n  ')}`);
  return catalog;
}
