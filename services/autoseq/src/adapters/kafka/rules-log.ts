import { z } from 'zod';
import { jsonOf, readLatest, type ReplayOptions } from '../../../../../shared/kafka/replay.js';
import type { ScopeState } from '../../core/learn/learner.js';
import { familiesShape } from '../redis/learn-store.js';

/**
 * The learned rules' copy on a compacted topic autoseq owns (`AUTOSEQ_RULES_TOPIC`): what survives a Redis
 * loss. Internal to the service, so plain JSON with these shapes rather than a public contract.
 *
 * - key `["<key prefix>","<tenant>","<agent>"]`: the scope's clock, its families' evidence and when the copy was
 *   taken (`{"v":1,"clock":N,"fam":{…},"at":MS}`, `fam` absent until a rule was scored; `fam` and `at` absent in
 *   copies of older versions);
 * - key `["<key prefix>","<tenant>","<agent>","<context>"]`: one context's value as Redis stores it (its
 *   next-tool counts, its slots and their rules: counts, bindings, state; never an argument value the agent
 *   passed, except a `const` binding's short constant), or a tombstone once the context was evicted.
 *
 * The prefix is part of the key: deployments sharing a topic (one per Redis key prefix) stay apart.
 */
const keyShape = z.union([
  z.tuple([z.string(), z.string().min(1), z.string().min(1)]),
  z.tuple([z.string(), z.string().min(1), z.string().min(1), z.string()]),
]);
// Not strict: a later version may add fields to the scope record, and this one must still read its clock.
const scopeValueV1 = z.object({
  v: z.literal(1),
  clock: z.number().int().nonnegative(),
  fam: familiesShape.optional(),
  /** When the copy was taken (epoch ms): absent in copies of older versions. */
  at: z.number().int().nonnegative().optional(),
});
const contextValueV1 = z.object({ v: z.literal(1), value: z.string().min(2) }).strict();

export const scopeRecordKey = (prefix: string, tenant: string, agent: string): string =>
  JSON.stringify([prefix, tenant, agent]);
export const contextRecordKey = (prefix: string, tenant: string, agent: string, ctx: string): string =>
  JSON.stringify([prefix, tenant, agent, ctx]);
export const scopeRecordValue = (clock: number, fam: Families | undefined, at: number): string =>
  JSON.stringify(fam ? { v: 1, clock, fam, at } : { v: 1, clock, at });
type Families = NonNullable<ScopeState['fam']>;
/** The stored text is carried as text: the copy is byte for byte what Redis held. */
export const contextRecordValue = (stored: string): string => JSON.stringify({ v: 1, value: stored });

/** One scope as the topic holds it now: its clock (0 when its clock record is missing) and its contexts. */
export interface ScopeCopyRead {
  tenant: string;
  agent: string;
  clock: number;
  /** The families' evidence (absent when the scope record holds none). */
  fam?: Families;
  /** When its latest copy was taken (epoch ms); absent in copies of older versions. */
  at?: number;
  /**
   * Its scope record is a tombstone, or is missing (compaction drops tombstones after `delete.retention.ms`):
   * the scope was retired, and what records of it remain are leftovers. Every copy writes the scope record.
   */
  retired?: true;
  ctxs: Map<string, string>;
}

/**
 * Reads the whole topic (its partitions from the low to the high watermark as they are now) and gives each
 * scope of `prefix` as the latest record of each key says, as compaction would keep it (a retired scope only
 * while records of its contexts remain). Records of other
 * prefixes, and records this version cannot read, are skipped and counted. Once `goOn` is false the read ends
 * with `ReplayStopped` (see `readRanges`).
 */
export async function readRulesLog(
  o: ReplayOptions,
  prefix: string,
  goOn: () => boolean = () => true,
): Promise<{ scopes: ScopeCopyRead[]; skipped: number }> {
  const latest = await readLatest(o, goOn);
  const scopes = new Map<string, ScopeCopyRead>();
  const withRecord = new Set<ScopeCopyRead>();
  let skipped = 0;
  for (const [k, v] of latest) {
    const key = keyShape.safeParse(jsonOf(k));
    if (!key.success) {
      skipped++;
      continue;
    }
    const [p, tenant, agent, ctx] = key.data;
    if (p !== prefix || (v === null && ctx !== undefined)) continue;
    const id = JSON.stringify([tenant, agent]);
    let s = scopes.get(id);
    if (!s) scopes.set(id, (s = { tenant, agent, clock: 0, ctxs: new Map() }));
    if (ctx === undefined) withRecord.add(s);
    if (v === null) s.retired = true;
    else if (ctx === undefined) {
      const r = scopeValueV1.safeParse(jsonOf(v));
      if (r.success) {
        s.clock = r.data.clock;
        if (r.data.fam) s.fam = r.data.fam;
        if (r.data.at !== undefined) s.at = r.data.at;
      } else skipped++;
    } else {
      const r = contextValueV1.safeParse(jsonOf(v));
      if (r.success) s.ctxs.set(ctx, r.data.value);
      else skipped++;
    }
  }
  for (const s of scopes.values()) if (!withRecord.has(s)) s.retired = true;
  // A scope whose only record is its scope record (its contexts all tombstoned) is still a scope: restored,
  // with its clock and families, or retired, so that the record does not stay on the topic for ever.
  return { scopes: [...scopes.values()].filter((s) => s.ctxs.size > 0 || !s.retired), skipped };
}
