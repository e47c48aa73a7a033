import { z } from 'zod';
import { jsonOf, readLatest, type ReplayOptions } from '../../../../../shared/kafka/replay.js';
import type { ScopeState } from '../../core/learn/learner.js';
import { familiesShape } from '../redis/learn-store.js';

/**
 * The learned rules' copy on a compacted topic autoseq owns (`AUTOSEQ_RULES_TOPIC`): what survives a Redis
 * loss. Internal to the service, so plain JSON with these shapes rather than a public contract.
 *
 * - key `["<key prefix>","<tenant>","<agent>"]`: the scope's clock, its families' evidence, when the copy was
 *   taken and the scope's forget generation when it was read (`{"v":1,"clock":N,"fam":{…},"at":MS,"forgets":G}`,
 *   `fam` absent until a rule was scored, `forgets` absent while the scope was never forgotten; `fam`, `at` and
 *   `forgets` absent in copies of older versions);
 * - key `["<key prefix>","<tenant>","<agent>","<context>"]`: one context's value as Redis stores it (its
 *   next-tool counts, its slots and their rules: counts, bindings, state; never an argument value the agent
 *   passed, except a `const` binding's short constant), with the scope's forget generation read in the same
 *   copy (`{"v":1,"value":"…","forgets":G}`, `forgets` absent while 0), or a tombstone once the context was
 *   evicted;
 * - key `["<key prefix>","<tenant>","<agent>",null]`: the scope's forget marker (`{"v":1,"forgets":G,"at":MS}`),
 *   written by `POST /rules/forget` and never tombstoned: a copy whose `forgets` is below G was read before that
 *   forget, and no restore brings it back (`restoreVerdict`): neither its scope record nor its context records,
 *   which a scope learned again after the forget does not replace unless it holds those contexts again.
 *
 * The prefix is part of the key: deployments sharing a topic (one per Redis key prefix) stay apart.
 */
const keyShape = z.union([
  z.tuple([z.string(), z.string().min(1), z.string().min(1)]),
  z.tuple([z.string(), z.string().min(1), z.string().min(1), z.string().nullable()]),
]);
// Not strict: a later version may add fields to the scope record, and this one must still read its clock.
const scopeValueV1 = z.object({
  v: z.literal(1),
  clock: z.number().int().nonnegative(),
  fam: familiesShape.optional(),
  /** When the copy was taken (epoch ms): absent in copies of older versions. */
  at: z.number().int().nonnegative().optional(),
  /** The scope's forget generation when the copy was read: absent while 0, and in copies of older versions. */
  forgets: z.number().int().nonnegative().optional(),
});
const markerValueV1 = z.object({
  v: z.literal(1),
  forgets: z.number().int().positive(),
  at: z.number().int().nonnegative().optional(),
});
const contextValueV1 = z
  .object({
    v: z.literal(1),
    value: z.string().min(2),
    /** The scope's forget generation when the context was copied: absent while 0, and in older copies. */
    forgets: z.number().int().positive().optional(),
  })
  .strict();

export const scopeRecordKey = (prefix: string, tenant: string, agent: string): string =>
  JSON.stringify([prefix, tenant, agent]);
export const contextRecordKey = (prefix: string, tenant: string, agent: string, ctx: string): string =>
  JSON.stringify([prefix, tenant, agent, ctx]);
/** The scope's forget marker: a key of its own, so that compaction keeps it beside the scope's tombstones. */
export const forgetMarkerKey = (prefix: string, tenant: string, agent: string): string =>
  JSON.stringify([prefix, tenant, agent, null]);
export const forgetMarkerValue = (forgets: number, at: number): string =>
  JSON.stringify({ v: 1, forgets, at });
/** `forgets` is left out while 0: a scope never forgotten copies the bytes an older version did. */
export const scopeRecordValue = (clock: number, fam: Families | undefined, at: number, forgets = 0): string =>
  JSON.stringify({ v: 1, clock, ...(fam ? { fam } : {}), at, ...(forgets > 0 ? { forgets } : {}) });
type Families = NonNullable<ScopeState['fam']>;
/**
 * The stored text is carried as text: the copy is byte for byte what Redis held. `forgets` (the generation the
 * copy read with the scope) is left out while 0, so a scope never forgotten copies the bytes it did before.
 */
export const contextRecordValue = (stored: string, forgets = 0): string =>
  JSON.stringify({ v: 1, value: stored, ...(forgets > 0 ? { forgets } : {}) });

/** One scope as the topic holds it now: its clock (0 when its clock record is missing) and its contexts. */
export interface ScopeCopyRead {
  tenant: string;
  agent: string;
  clock: number;
  /** The families' evidence (absent when the scope record holds none). */
  fam?: Families;
  /** When its latest copy was taken (epoch ms); absent in copies of older versions. */
  at?: number;
  /** The scope's forget generation when its latest copy was read (absent: 0, or a copy of an older version). */
  forgets?: number;
  /** Its forget marker's generation: absent while the scope was never forgotten. */
  forgotten?: number;
  /**
   * Its scope record is a tombstone, or is missing (compaction drops tombstones after `delete.retention.ms`):
   * the scope was retired, and what records of it remain are leftovers. Every copy writes the scope record.
   */
  retired?: true;
  ctxs: Map<string, string>;
  /**
   * Each context's forget generation as its record carries it, for those above 0 (absent: 0, a context never
   * copied after a forget or copied by an older version). A context below the scope's marker was copied before
   * the forget: a stale copy that landed after the forget's tombstones left it (`restoreVerdict` leaves it out).
   */
  ctxForgets?: Map<string, number>;
}

/** A scope's forget generation as the topic last recorded it: its marker's, or a later copy's. */
export interface ForgetGeneration {
  tenant: string;
  agent: string;
  forgets: number;
}

/**
 * Reads the whole topic (its partitions from the low to the high watermark as they are now) and gives each
 * scope of `prefix` as the latest record of each key says (`rulesOfLog`). Once `goOn` is false the read ends
 * with `ReplayStopped` (see `readRanges`).
 */
export async function readRulesLog(
  o: ReplayOptions,
  prefix: string,
  goOn: () => boolean = () => true,
): Promise<{ scopes: ScopeCopyRead[]; skipped: number; generations: ForgetGeneration[] }> {
  return rulesOfLog(await readLatest(o, goOn), prefix);
}

/**
 * Each scope of `prefix` as the latest record of each key says, as compaction would keep it (a retired scope
 * only while records of its contexts remain), with its forget marker; and, per scope, the highest forget
 * generation the topic holds (its marker's or a copy's), which a restore writes back to Redis. Records of other
 * prefixes, and records this version cannot read, are skipped and counted.
 */
export function rulesOfLog(
  latest: ReadonlyMap<string, Buffer | string | null>,
  prefix: string,
): { scopes: ScopeCopyRead[]; skipped: number; generations: ForgetGeneration[] } {
  const scopes = new Map<string, ScopeCopyRead>();
  const withRecord = new Set<ScopeCopyRead>();
  const generations = new Map<string, ForgetGeneration>();
  const markers = new Map<string, number>();
  const generation = (id: string, tenant: string, agent: string, forgets: number) => {
    const g = generations.get(id);
    if (!g) generations.set(id, { tenant, agent, forgets });
    else g.forgets = Math.max(g.forgets, forgets);
  };
  let skipped = 0;
  for (const [k, v] of latest) {
    const key = keyShape.safeParse(jsonOf(k));
    if (!key.success) {
      skipped++;
      continue;
    }
    const [p, tenant, agent, ctx] = key.data;
    if (p !== prefix) continue;
    const id = JSON.stringify([tenant, agent]);
    if (ctx === null) {
      // Nothing tombstones a marker; one that is (by hand) is no marker.
      if (v === null) continue;
      const r = markerValueV1.safeParse(jsonOf(v));
      if (r.success) {
        markers.set(id, r.data.forgets);
        generation(id, tenant, agent, r.data.forgets);
      } else skipped++;
      continue;
    }
    if (v === null && ctx !== undefined) continue;
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
        if (r.data.forgets !== undefined) {
          s.forgets = r.data.forgets;
          generation(id, tenant, agent, r.data.forgets);
        }
      } else skipped++;
    } else {
      const r = contextValueV1.safeParse(jsonOf(v));
      if (r.success) {
        s.ctxs.set(ctx, r.data.value);
        if (r.data.forgets !== undefined) {
          (s.ctxForgets ??= new Map()).set(ctx, r.data.forgets);
          generation(id, tenant, agent, r.data.forgets);
        }
      } else skipped++;
    }
  }
  for (const [id, s] of scopes) {
    if (!withRecord.has(s)) s.retired = true;
    const marker = markers.get(id);
    if (marker !== undefined) s.forgotten = marker;
  }
  // A scope whose only record is its scope record (its contexts all tombstoned) is still a scope: restored,
  // with its clock and families, or retired, so that the record does not stay on the topic for ever.
  return {
    scopes: [...scopes.values()].filter((s) => s.ctxs.size > 0 || !s.retired),
    skipped,
    generations: [...generations.values()],
  };
}

export type RestoreVerdict =
  | {
      restore: true;
      leftMs: number;
      /** The contexts to write back: those copied after the scope's latest forget. */
      ctxs: Map<string, string>;
      /** Contexts left out as copied before the scope's latest forget (records a stale copy left). */
      stale: string[];
    }
  | { restore: false; why: 'retired' | 'forgotten' | 'expired' };

/**
 * Whether a restore writes a scope's copy back, and with what left of its idle lifetime (`scopeTtlMs` 0: none,
 * it never expires). Left out: a retired scope (its scope record a tombstone or missing) whatever the TTL; a
 * scope whose copy was read before its latest forget (its `forgets` below its marker's: a copy of an older
 * version counts as 0, so any marker keeps it out), whatever the TTL and whatever its copy's age; one idle for
 * longer than the TTL by its copy's age (a copy of an older version, without `at`, gets the whole TTL).
 *
 * A scope written back gets only the contexts copied after its latest forget (their generation at least the
 * marker's; one without counts as 0): a copy read before the forget that landed after its tombstones and was
 * never fenced left its contexts on the topic, and the scope learned again replaces only those it holds again.
 *
 * `held`: the scope's forget generation Redis holds once the restore wrote the topic's back (`raiseForgets`),
 * taken as a marker when higher than the topic's: a forget whose marker was not sent, or whose marker a stalled
 * earlier forget's replaced (a lower one landing last), still counts where Redis kept its generation.
 */
export function restoreVerdict(s: ScopeCopyRead, scopeTtlMs: number, now: number, held = 0): RestoreVerdict {
  if (s.retired) return { restore: false, why: 'retired' };
  const marker = Math.max(s.forgotten ?? 0, held);
  if ((s.forgets ?? 0) < marker) return { restore: false, why: 'forgotten' };
  const leftMs = scopeTtlMs > 0 && s.at !== undefined ? scopeTtlMs - Math.max(0, now - s.at) : scopeTtlMs;
  if (scopeTtlMs > 0 && leftMs <= 0) return { restore: false, why: 'expired' };
  if (marker === 0) return { restore: true, leftMs, ctxs: s.ctxs, stale: [] };
  const ctxs = new Map<string, string>();
  const stale: string[] = [];
  for (const [ctx, value] of s.ctxs) {
    if ((s.ctxForgets?.get(ctx) ?? 0) >= marker) ctxs.set(ctx, value);
    else stale.push(ctx);
  }
  return { restore: true, leftMs, ctxs, stale };
}
