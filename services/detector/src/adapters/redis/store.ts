import { fileURLToPath } from 'node:url';
import type { ChainableCommander, Redis } from 'ioredis';
import { z } from 'zod';
import {
  defineScripts,
  invokeScript,
  parseScriptReply,
  readScripts,
} from '../../../../../shared/redis/scripts.js';
import { scopeTag } from '../../../../../shared/redis/keys.js';
import { execPipeline, redisFailure } from '../../../../../shared/redis/replies.js';
import { classifyError, errorMessage, PaverError } from '../../../../../shared/errors.js';
import type { DetectorOp, Scope } from '../../core/ops.js';
import { scopeId } from '../../core/ops.js';
import { stateFingerprint, type DetectorParams } from '../../core/params.js';
import { SEP } from '../../core/grams.js';
import type { GramStat } from '../../core/select.js';
import { emptyResult, type ApplyResult, type TermRecord } from '../../core/state.js';

export const SCRIPT_DIR = fileURLToPath(new URL('./lua/', import.meta.url));
/** Script name → key count: the file each name must load (a stale build may still hold older versions). */
export const SCRIPT_KEYS = {
  apply: 11,
  snapshot: 3,
  claimSnapshot: 8,
  release: 4,
  stamp: 1,
  raiseStamp: 1,
  retireClaim: 4,
  retireFinish: 15,
  retireEpoch: 1,
  unlock: 1,
} as const;
export const SCRIPTS = Object.keys(SCRIPT_KEYS) as (keyof typeof SCRIPT_KEYS)[];

/**
 * How many zsets and hashes the window and its records are split over (apply-11.lua's WINDOW_BUCKETS): one per
 * 100 records of lookback, so each stays in Redis's compact listpack encoding under its default limits.
 */
export const windowBuckets = (lookback: number): number => Math.max(1, Math.ceil(lookback / 100));

/** One pure key builder for the detector's keyspace: `<prefix>:det:{tenant|agent}:<name>`. */
export function detectorKeys(prefix: string, s: Scope) {
  const base = `${prefix}:det:${scopeTag(s.tenant, s.agent)}`;
  const k = (name: string) => `${base}:${name}`;
  return {
    meta: k('meta'),
    /** The last publication stamp (`detected_at`; lua/lib/stamp.lua). */
    stamp: k('stamp'),
    open: k('open'),
    events: k('events'),
    done: k('done'),
    window: k('window'),
    records: k('records'),
    support: k('support'),
    exact: k('exact'),
    msgs: k('msgs'),
    starts: k('starts'),
    tools: k('tools'),
    lock: k('lock'),
    dirty: k('dirty'),
    published: k('published'),
  };
}

/**
 * Keys outside any scope (each its own slot; never touched by a script together with scope keys): the epoch
 * marker (shared/redis/epoch.ts), the epoch each partition's state was last rebuilt in, the scopes holding
 * state per partition (what the checkpoint's minimum is taken over), and the index of those registries.
 */
export function detectorGlobalKeys(prefix: string) {
  return {
    epoch: `${prefix}:det:epoch`,
    rebuilt: `${prefix}:det:rebuilt`,
    scopes: (partition: number) => `${prefix}:det:scopes:${partition}`,
    /**
     * The partitions that have a registry (never taken out: there are as many as the topic has partitions), and
     * `REGISTRIES_COMPLETE` once a sweep has checked that no registry is missing from it.
     */
    registries: `${prefix}:det:scopes`,
  };
}

/**
 * The member of the registry index saying that every registry is listed in it. Registries written before the
 * index existed (an earlier version) are not, nor are any if the index key alone was lost (evicted): a sweep
 * that does not find this member looks for them once with SCAN, lists them, and adds it.
 */
export const REGISTRIES_COMPLETE = 'complete';

/** SCAN MATCH treats these as a pattern: a prefix holding one must match only itself. */
const globEscape = (s: string) => s.replace(/[*?[\]\\]/g, '\\$&');

/**
 * A sweep's check of the epoch marker before each scope it acts on, carried by the last round trip of the scope
 * before (retireClaim, retireFinish, unregister read the marker last in theirs when given one): `still` says
 * whether it named `epoch` then; unset when no round trip has read it since the sweep last looked.
 */
export interface MarkerWatch {
  epoch: string;
  still?: boolean;
}

/** apply-11.lua's keys, in its order (also the first keys of retireFinish-15.lua). */
const stateKeys = (k: ReturnType<typeof detectorKeys>) => [
  k.meta,
  k.open,
  k.events,
  k.done,
  k.window,
  k.records,
  k.support,
  k.exact,
  k.msgs,
  k.starts,
  k.tools,
];

/** Script status when a scope's state belongs to another epoch (apply mode "n"). */
const OTHER_EPOCH = -4;
/** Script status when a scope's state is of an older layout, the same parameters (apply mode "n"). */
const OLDER_LAYOUT = -6;

const CODES = {
  [-2]: {
    code: 'REDIS_STATE_CONFLICT' as const,
    message:
      'detector state under this key prefix was built with other parameters; use a new REDIS_KEY_PREFIX or delete the old keys',
  },
  // Retriable: the lock expired, or Redis lost it with the rest of the state; the batch is applied again
  // (its events are then duplicates), which publishes again, after a rebuild if the state is gone.
  [-3]: {
    code: 'STATE_CONTENDED' as const,
    message: 'publication lock lost (TTL expired, or Redis lost its state)',
  },
  [-7]: {
    code: 'REDIS_STATE_CONFLICT' as const,
    message:
      'detector state under this key prefix was written by a newer version of the detector (a newer state layout); finish the update, or run this version on a new REDIS_KEY_PREFIX',
  },
};
const applyReply = z
  .tuple([
    z.literal(1),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
    z.number(),
  ])
  .rest(z.number());
const flatReply = z.array(z.union([z.string(), z.number()]));

export interface BatchOutcome extends Omit<ApplyResult, 'changed'> {
  changed: Scope[];
  /**
   * Scopes with a change not yet published: changed by this batch, or earlier by a batch whose publication never
   * released (its instance died; a redelivery then finds only duplicates). What the batch must publish.
   */
  owed: Scope[];
  /**
   * With an epoch: the Redis state this batch was meant for is gone (the marker was missing or replaced before
   * or after the scripts ran, or a scope belongs to another epoch). What the batch wrote must not be trusted.
   */
  lost: boolean;
  /**
   * A scope's state is of an older layout (an earlier version wrote it): lost too, and every partition's part of
   * every scope is likely so, not only this batch's. The caller ends the epoch (retireEpoch), so that each
   * partition is rebuilt.
   */
  olderLayout?: true;
  /**
   * Scopes whose state belongs to an earlier epoch while the marker named `epoch` throughout (so not a loss seen
   * by this batch): state no rebuild of this epoch has reached. See `RedisDetectorStore.clearStale`.
   */
  stale: Scope[];
  /** The marker was missing or replaced before or after the scripts: the Redis state this batch meant is gone. */
  markerLost: boolean;
}

export interface ApplyOptions {
  /** The epoch the caller verified; the marker is read before and after the scripts in the same round trip. */
  epoch?: string;
  /** "r" while rebuilding: a scope written under another epoch is deleted first (see apply-11.lua). */
  mode?: 'n' | 'r';
  /** Scopes to bring under `epoch` even with no op (rebuild mode: clears what a lost batch wrote). */
  touch?: Scope[];
}

const scopeMember = (s: Scope) => JSON.stringify([s.tenant, s.agent]);
const memberScope = (m: string): Scope | null => {
  const r = z.tuple([z.string(), z.string()]).safeParse(JSON.parse(m));
  return r.success ? { tenant: r.data[0], agent: r.data[1] } : null;
};

/**
 * One place for a failed script call in a pipeline: a lost connection is retriable (classifyError knows
 * the shapes); anything else is a script failure (a bug or a state the script refuses), not retried.
 */
export function pipelineError(script: string, err: unknown): PaverError {
  const c = classifyError(err);
  if (c.retriable) return c;
  return new PaverError('REDIS_SCRIPT_FAILED', `${script}: ${errorMessage(err)}`, { cause: err });
}

/**
 * The code of the scope's i-th tool (from 0), as apply-11.lua's codeOf gives it: printable ASCII whose last
 * byte, and only that one, is >= "@" (63 one-byte codes, then 63 × 32 two-byte codes, and so on).
 */
export function toolCode(i: number): string {
  let cap = 63;
  let len = 1;
  while (i >= cap) {
    i -= cap;
    cap *= 32;
    len++;
  }
  let s = String.fromCharCode(64 + (i % 63));
  i = Math.floor(i / 63);
  for (let d = 1; d < len; d++) {
    s = String.fromCharCode(32 + (i % 32)) + s;
    i = Math.floor(i / 32);
  }
  return s;
}

/** Decodes concatenated tool codes with a scope's dictionary (names joined by "\x1f", in code order). */
export function toolDecoder(dictionary: string): (codes: string) => string[] {
  const byCode = new Map<string, string>();
  if (dictionary !== '') dictionary.split('\u001f').forEach((name, i) => byCode.set(toolCode(i), name));
  return (codes) => {
    const out: string[] = [];
    let from = 0;
    for (let i = 0; i < codes.length; i++) {
      if (codes.charCodeAt(i) < 64) continue;
      const name = byCode.get(codes.slice(from, i + 1));
      if (name === undefined)
        throw new PaverError('INTERNAL', 'detector record holds a tool code missing from its dictionary');
      out.push(name);
      from = i + 1;
    }
    return out;
  };
}

/**
 * A window record as apply-11.lua packs it: its tools' codes, costs and, when the task had a user message,
 * its terms.
 */
export function unpackRecord(packed: string, decode: (codes: string) => string[]): TermRecord {
  const [tools = '', , terms] = packed.split('\u001e');
  return {
    tools: decode(tools),
    terms: terms === undefined ? null : terms === '' ? [] : terms.split(','),
  };
}

export interface Snapshot {
  stats: GramStat[];
  records: TermRecord[];
}

/**
 * A snapshot as snapshot-3.lua (and claimSnapshot-8.lua after its published map) returns it, from `at`: the
 * tool dictionary, then grams and records in tool codes, decoded here (not in Redis, which serves every
 * instance).
 */
function parseSnapshot(reply: (string | number)[], at: number): Snapshot {
  const decode = toolDecoder(String(reply[at]));
  at++;
  const n = Number(reply[at]);
  const stats: GramStat[] = [];
  for (let i = 0; i < n; i++) {
    const j = at + 1 + i * 4;
    stats.push({
      key: decode(String(reply[j])).join(SEP),
      support: Number(reply[j + 1]),
      exact: Number(reply[j + 2]),
      cost: Number(reply[j + 3]),
    });
  }
  const records = reply.slice(at + 1 + n * 4).map((packed) => unpackRecord(String(packed), decode));
  return { stats, records };
}

/** The detector state in Redis: the Lua twin of core/state.ts. */
export class RedisDetectorStore {
  private readonly cfg: string;
  private readonly global: ReturnType<typeof detectorGlobalKeys>;
  /** partition + scope pairs this process has added to the per-partition scope sets, and when. */
  private readonly knownScopes = new Map<string, number>();
  /** When `knownScopes` last dropped what it no longer trusts. */
  private prunedAt = 0;
  /** Redis round trips made so far; read by `paver_detector_redis_round_trips_total` (metrics.ts). */
  roundTrips = 0;
  constructor(
    private readonly redis: Redis,
    private readonly params: DetectorParams,
    private readonly prefix: string,
    /**
     * The publication lock's TTL: a publication takes at most this long, so a change still owed after it was
     * abandoned by an instance that died (tests shorten it).
     */
    readonly publicationLockMs = 30_000,
    /**
     * How long this instance trusts its memory of having registered a (partition, scope): a sweeper that died
     * between taking a scope out of a registry and putting it back (retireFinish) left it out while it has
     * state, and the scope's next batch after this long registers it again (one SADD per scope and partition a
     * minute; tests shorten it).
     */
    private readonly registryRefreshMs = 60_000,
  ) {
    this.cfg = stateFingerprint(params);
    this.global = detectorGlobalKeys(prefix);
    const files = readScripts(SCRIPT_DIR, [...SCRIPTS]).filter(
      (f) => SCRIPT_KEYS[f.name as keyof typeof SCRIPT_KEYS] === f.numberOfKeys,
    );
    if (files.length !== SCRIPTS.length)
      throw new PaverError('INTERNAL', `detector Lua scripts missing from ${SCRIPT_DIR}: rebuild`);
    defineScripts(redis, files);
  }

  /**
   * A round trip made on this store's connection outside it (the epoch marker's check, shared/redis/epoch.ts),
   * counted as the store's own are.
   */
  counted<T>(call: Promise<T>): Promise<T> {
    return this.trip(call);
  }

  /**
   * Counts a round trip once it is answered or has failed: `roundTrips` holds every one made, not only those
   * that succeeded.
   */
  private async trip<T>(call: T): Promise<Awaited<T>> {
    try {
      return await call;
    } finally {
      this.roundTrips++;
    }
  }

  /**
   * Runs `pipe` (a failure goes through redisFailure) and returns its replies; with `watch`, reads the epoch
   * marker last in the same round trip, for the sweep's check before its next scope.
   */
  private async execWatched(pipe: ChainableCommander, what: string, watch?: MarkerWatch): Promise<unknown[]> {
    if (watch) pipe.get(this.global.epoch);
    const replies = await this.trip(execPipeline(pipe, what));
    if (watch) watch.still = replies.pop() === watch.epoch;
    return replies;
  }

  /**
   * Queues registrations (the scope holds state from the partition) on `pipe`, each partition into the registry
   * index first: a pipeline runs in order, so a registry entry a sweep can read always has its partition in the
   * index (the index is never taken out). Returns how many commands it queued.
   */
  private register(pipe: ChainableCommander, entries: { partition: number; scope: Scope }[]): number {
    if (!entries.length) return 0;
    pipe.sadd(this.global.registries, ...new Set(entries.map((e) => String(e.partition))));
    for (const e of entries) pipe.sadd(this.global.scopes(e.partition), scopeMember(e.scope));
    return entries.length + 1;
  }

  /**
   * One script call per scope, all in one pipeline: one round trip per batch. With an epoch, the marker is
   * read first and last in the same pipeline: a loss before or during the batch is seen by this very call.
   */
  async applyBatch(ops: readonly DetectorOp[], opts: ApplyOptions = {}): Promise<BatchOutcome> {
    const byScope = new Map<string, { scope: Scope; packed: string; parts: Set<number> }>();
    const group = (scope: Scope) => {
      const id = scopeId(scope);
      let g = byScope.get(id);
      if (!g) byScope.set(id, (g = { scope, packed: '', parts: new Set() }));
      return g;
    };
    for (const s of opts.touch ?? []) group(s);
    // Every field followed by \x1f (none holds a control character): one argument for all of a scope's ops,
    // built as one string (no array of 9 fields per op to join).
    for (const op of ops) {
      const g = group(op.scope);
      const part = op.partition ?? 0;
      const off = op.offset ?? '';
      if (op.kind === 'call')
        g.packed += `c\u001f${op.task}\u001f${op.eventId}\u001f${op.ts}\u001f${op.step}\u001f${op.tool}\u001f${op.cost}\u001f${part}\u001f${off}\u001f`;
      else if (op.kind === 'msg')
        g.packed += `m\u001f${op.task}\u001f${op.eventId}\u001f${op.ts}\u001f0\u001f${op.terms.join(',')}\u001f0\u001f${part}\u001f${off}\u001f`;
      else
        g.packed += `d\u001f${op.task}\u001f${op.eventId}\u001f${op.ts}\u001f0\u001f\u001f0\u001f${part}\u001f${off}\u001f`;
      g.parts.add(part);
    }
    const { changed: _c, ...zero } = emptyResult();
    const out: BatchOutcome = {
      ...zero,
      changed: [],
      owed: [],
      lost: false,
      stale: [],
      markerLost: false,
    };
    if (byScope.size === 0) return out;
    const pipe = this.redis.pipeline();
    const epoch = opts.epoch;
    if (epoch !== undefined) pipe.get(this.global.epoch);
    const groups = [...byScope.values()];
    // Which scopes hold state per partition (the checkpoint's minimum runs over them); added before the
    // script that writes the state, never removed, so a concurrent checkpoint cannot miss a scope.
    const added: string[] = [];
    const registrations: { partition: number; scope: Scope }[] = [];
    const now = Date.now();
    // A memory past registryRefreshMs is not trusted anyway (the scope is registered again): dropping it keeps
    // the map to the scopes of the last refresh periods, not every (partition, scope) this process ever applied
    // to (a run id in agent_id makes one per run, and a scope another instance retires is not unregistered here).
    if (now - this.prunedAt >= this.registryRefreshMs) {
      for (const [m, at] of this.knownScopes)
        if (now - at >= this.registryRefreshMs) this.knownScopes.delete(m);
      this.prunedAt = now;
    }
    for (const g of groups)
      for (const part of g.parts) {
        const member = `${part}\u001f${scopeId(g.scope)}`;
        const at = this.knownScopes.get(member);
        if (at !== undefined && now - at < this.registryRefreshMs) continue;
        registrations.push({ partition: part, scope: g.scope });
        added.push(member);
      }
    const registered = this.register(pipe, registrations);
    for (const g of groups)
      invokeScript(pipe, 'apply', stateKeys(detectorKeys(this.prefix, g.scope)), [
        this.cfg,
        epoch ?? '',
        opts.mode ?? 'n',
        g.packed,
        this.publicationLockMs,
      ]);
    if (epoch !== undefined) pipe.get(this.global.epoch);
    const replies = (await this.trip(pipe.exec())) ?? [];
    const failed = replies.find(([err]) => err);
    if (failed) throw pipelineError('apply', failed[0]);
    let at = 0;
    if (epoch !== undefined) {
      const before = replies[0]![1];
      const after = replies[replies.length - 1]![1];
      if (before !== epoch || after !== epoch) out.lost = out.markerLost = true;
      at = 1;
    }
    at += registered;
    for (const m of added) this.knownScopes.set(m, now);
    const fresh: { scope: Scope; parts: Set<number> }[] = [];
    groups.forEach((g, i) => {
      const reply = replies[at + i]![1];
      if (Array.isArray(reply) && (reply[0] === OTHER_EPOCH || reply[0] === OLDER_LAYOUT)) {
        out.lost = true;
        if (reply[0] === OLDER_LAYOUT) out.olderLayout = true;
        else out.stale.push(g.scope);
        return;
      }
      const [, changed, applied, ignored, completed, dup, late, limit, misrouted, owed, isFresh] =
        parseScriptReply('apply', reply, applyReply, CODES);
      if (isFresh === 1) fresh.push(g);
      out.applied += applied;
      out.ignored += ignored;
      out.ignoredBy.duplicate += dup;
      out.ignoredBy.late += late;
      out.ignoredBy.task_limit += limit;
      out.ignoredBy.misrouted += misrouted;
      out.completed += completed;
      if (changed === 1) out.changed.push(g.scope);
      if (owed === 1) out.owed.push(g.scope);
    });
    // A scope with no state before this batch (or none on one of its partitions): new, or retired while idle
    // by an instance that may be taking it out of the registries right now (retire). Registered again after the state exists: whichever order
    // the two take, one of them leaves it registered (retire re-registers a scope whose state it finds).
    if (fresh.length) {
      const again = this.redis.pipeline();
      const members: string[] = [];
      const entries: { partition: number; scope: Scope }[] = [];
      for (const g of fresh)
        for (const part of g.parts) {
          entries.push({ partition: part, scope: g.scope });
          members.push(`${part}\u001f${scopeId(g.scope)}`);
        }
      this.register(again, entries);
      // Forgotten until written: if this write fails, the batch's retry finds the state there (not fresh), and
      // only an unknown scope is registered then.
      for (const m of members) this.knownScopes.delete(m);
      await this.trip(execPipeline(again, 'scope registry write'));
      for (const m of members) this.knownScopes.set(m, now);
    }
    return out;
  }

  /**
   * Ends the Redis epoch `epoch` (deletes its marker) if the marker still names it: every partition then finds
   * its state lost and is rebuilt under a new epoch (shared/redis/epoch.ts). True when this call ended it.
   */
  async retireEpoch(epoch: string): Promise<boolean> {
    const reply = await this.trip(invokeScript(this.redis, 'retireEpoch', [this.global.epoch], [epoch]));
    return parseScriptReply('retireEpoch', reply, z.union([z.literal(0), z.literal(1)]), {}) === 1;
  }

  /**
   * Clears scopes of an earlier epoch (`BatchOutcome.stale`) and brings them under `epoch`, as the first rebuild
   * op to reach each would. A batch's partition has been rebuilt in `epoch` before it is applied, yet a scope can
   * be left in an earlier one: the epoch ended without a loss (an older layout met: retireEpoch; an evicted
   * marker) and no rebuild replayed an event of it (the tool-calls topic no longer held them). Refused in normal
   * mode for good, its next batch stalled its partition. Lost if the marker changed meanwhile.
   */
  async clearStale(scopes: Scope[], epoch: string): Promise<boolean> {
    return !(await this.applyBatch([], { epoch, mode: 'r', touch: scopes })).lost;
  }

  /** How many (partition, scope) registrations this process remembers: those of about the last two refresh periods. */
  get rememberedRegistrations(): number {
    return this.knownScopes.size;
  }

  /** Forgets which scopes this process has registered (after a loss, the registry itself is gone). */
  forgetScopes(): void {
    this.knownScopes.clear();
  }

  /**
   * Where a rebuild of `partition` must start replaying: the smallest start offset of any open task or window
   * record from that partition, over every scope, capped by `next` (the next offset to process). The value
   * only grows over time, so an older checkpoint is always a safe (longer) replay.
   *
   * Null when the state is no longer `epoch`'s: a loss after the batch leaves no starts, and reading that
   * emptiness as "nothing open" would give `next`, a checkpoint past the whole window, so the rebuild the
   * loss calls for would replay nothing. Each round trip ends by reading the marker: if it still names
   * `epoch`, nothing read before it in that round trip came from a lost state.
   */
  async checkpoint(partition: number, next: bigint, epoch: string): Promise<bigint | null> {
    const head =
      (await this.trip(
        this.redis.pipeline().smembers(this.global.scopes(partition)).get(this.global.epoch).exec(),
      )) ?? [];
    for (const [err] of head) if (err) throw pipelineError('checkpoint', err);
    if (head[1]?.[1] !== epoch) return null;
    let min = next;
    const members = z.array(z.string()).parse(head[0]?.[1]);
    const scopes = members.map(memberScope).filter((s): s is Scope => s !== null);
    if (scopes.length === 0) return min;
    const pipe = this.redis.pipeline();
    for (const s of scopes)
      pipe.zrange(`${detectorKeys(this.prefix, s).starts}:${partition}`, 0, 0, 'WITHSCORES');
    pipe.get(this.global.epoch);
    const replies = (await this.trip(pipe.exec())) ?? [];
    for (const [err] of replies) if (err) throw pipelineError('checkpoint', err);
    if (replies[replies.length - 1]?.[1] !== epoch) return null;
    for (const [, reply] of replies.slice(0, -1)) {
      const r = z.array(z.string()).parse(reply);
      if (r.length === 2 && BigInt(r[1]!) < min) min = BigInt(r[1]!);
    }
    return min;
  }

  /**
   * After a loss, the `published` maps are gone with the state, and a candidate published before it that is
   * no longer live would never be retracted. This puts back, without overwriting anything published since,
   * an entry for every candidate the topic still holds as active (its value unknown: it is sent again). And the
   * publication stamps (`stamps`: each scope's latest `detected_at` on the topic) go back under the next ones, so
   * that a Redis whose clock is behind the lost one's does not stamp records flows would drop as stale. A stamp
   * this creates expires after `stampTtlMs` (DETECTOR_SCOPE_TTL_MS; 0: never), as a retired scope's does.
   */
  async restorePublished(
    active: { scope: Scope; keys: string[] }[],
    stamps: { scope: Scope; at: number }[] = [],
    stampTtlMs = 0,
  ): Promise<void> {
    if (active.length === 0 && stamps.length === 0) return;
    const pipe = this.redis.pipeline();
    for (const { scope, keys } of active)
      for (const key of keys) pipe.hsetnx(detectorKeys(this.prefix, scope).published, key, '');
    for (const { scope, at } of stamps)
      invokeScript(
        pipe,
        'raiseStamp',
        [detectorKeys(this.prefix, scope).stamp],
        [Math.floor(at), stampTtlMs],
      );
    const replies = (await this.trip(pipe.exec())) ?? [];
    const failed = replies.find(([err]) => err);
    if (failed) throw pipelineError('restore published', failed[0]);
  }

  /** The epoch in which `partition`'s state was last fully rebuilt (or found complete), if any. */
  async rebuiltIn(partition: number): Promise<string | null> {
    const v = await this.trip(this.redis.hget(this.global.rebuilt, String(partition)));
    return v;
  }

  async markRebuilt(partition: number, epoch: string): Promise<void> {
    await this.trip(this.redis.hset(this.global.rebuilt, String(partition), epoch));
  }

  /** The frequent sequences and, with request terms on, the window's records, in one atomic read. */
  async snapshot(scope: Scope): Promise<Snapshot> {
    const k = detectorKeys(this.prefix, scope);
    const reply = parseScriptReply(
      'snapshot',
      await this.trip(
        invokeScript(
          this.redis,
          'snapshot',
          [k.support, k.tools, k.records],
          [
            this.params.minOccurrences,
            this.params.requestTerms ? '1' : '0',
            windowBuckets(this.params.lookback),
          ],
        ),
      ),
      flatReply,
    );
    return parseSnapshot(reply, 1);
  }

  /**
   * Whether the scope holds a change no publication has released yet (apply-11.lua's `owed`), owed since
   * `since` (Redis time, ms) or earlier when given: a change applied later has a live instance to publish it.
   */
  async isOwed(scope: Scope, since?: number): Promise<boolean> {
    const k = detectorKeys(this.prefix, scope);
    let v: (string | null)[];
    try {
      v = await this.trip(this.redis.hmget(k.meta, 'owed', 'owedAt'));
    } catch (err) {
      throw redisFailure('owed read', err);
    }
    if (v[0] === null) return false;
    return since === undefined || v[1] === null || Number(v[1]) <= since;
  }

  /**
   * Every scope holding state (the per-partition registries) whose oldest owed change is older than a
   * publication may take, by Redis's clock: changes whose instance died before publishing them, which no batch
   * has taken up (the scope gets none).
   */
  async abandoned(): Promise<Scope[]> {
    return (await this.scan(0)).abandoned;
  }

  /**
   * One pass over the registered scopes (what the service's sweep reads every minute): `abandoned` as above,
   * and with `idleMs` > 0, the scopes whose last apply is at least `idleMs` ago by Redis's clock, or that have
   * no record of it yet (retireClaim-4.lua decides; it starts their clock), with the partitions registering
   * them.
   *
   * `rebuiltOnly`: only scopes every partition of which `rebuilt` names the current epoch, read with the marks
   * between two reads of the marker (`epoch`: the marker both read; null when missing or replaced meanwhile,
   * and then no scope). The others are counted in `held`: their state may be lost, or a rebuild may be
   * replaying it with the publication maps not yet restored (see the sweep in publisher.ts).
   */
  async scan(
    idleMs: number,
    opts: { rebuiltOnly?: boolean } = {},
  ): Promise<{
    abandoned: Scope[];
    idle: { scope: Scope; partitions: number[] }[];
    held: number;
    epoch?: string | null;
  }> {
    const scopes = new Map<string, { scope: Scope; partitions: number[] }>();
    for (const [partition, members] of await this.readRegistries(await this.registryPartitions()))
      for (const m of members) {
        const s = memberScope(m);
        if (!s) continue;
        const id = scopeId(s);
        let e = scopes.get(id);
        if (!e) scopes.set(id, (e = { scope: s, partitions: [] }));
        if (!e.partitions.includes(partition)) e.partitions.push(partition);
      }
    if (!scopes.size) return { abandoned: [], idle: [], held: 0 };
    const list = [...scopes.values()];
    const gated = opts.rebuiltOnly === true;
    const pipe = this.redis.pipeline().time();
    if (gated) pipe.get(this.global.epoch).hgetall(this.global.rebuilt);
    for (const { scope } of list)
      pipe.hmget(detectorKeys(this.prefix, scope).meta, 'owed', 'owedAt', 'seenAt');
    if (gated) pipe.get(this.global.epoch);
    const [time, ...rest] = await this.trip(execPipeline(pipe, 'owed marks read'));
    const [sec, usec] = z.tuple([z.string(), z.string()]).parse(time);
    const now = Number(sec) * 1000 + Math.floor(Number(usec) / 1000);
    let marks = rest;
    let rebuilt: Record<string, string> = {};
    let epoch: string | null | undefined;
    if (gated) {
      const before = z.string().nullable().parse(rest[0]);
      rebuilt = z.record(z.string(), z.string()).parse(rest[1]);
      marks = rest.slice(2, -1);
      epoch = before !== null && rest[rest.length - 1] === before ? before : null;
      if (epoch === null) return { abandoned: [], idle: [], held: list.length, epoch };
    }
    const abandoned: Scope[] = [];
    const idle: { scope: Scope; partitions: number[] }[] = [];
    let held = 0;
    list.forEach((e, i) => {
      if (gated && !e.partitions.every((p) => rebuilt[String(p)] === epoch)) {
        held++;
        return;
      }
      const [owed, at, seen] = z.array(z.string().nullable()).parse(marks[i]);
      if (owed && at !== null && now - Number(at) >= this.publicationLockMs) abandoned.push(e.scope);
      else if (idleMs > 0 && (seen === null || seen === undefined || now - Number(seen) >= idleMs))
        idle.push(e);
    });
    return { abandoned, idle, held, ...(gated ? { epoch } : {}) };
  }

  /**
   * The partitions that have a scope registry, from the registry index: one round trip. An index not known to be
   * complete (`REGISTRIES_COMPLETE` missing: registries written by an earlier version, which kept no index, or the
   * index key alone lost) is completed first by SCAN over the keyspace, once: a round trip per page (1,000 keys
   * each), and one to record what it found.
   */
  private async registryPartitions(): Promise<number[]> {
    let index: string[];
    try {
      index = await this.trip(this.redis.smembers(this.global.registries));
    } catch (err) {
      throw redisFailure('scope registry index read', err);
    }
    const found = new Set<number>();
    const add = (p: string) => {
      if (/^\d+$/.test(p) && Number.isSafeInteger(Number(p))) found.add(Number(p));
    };
    index.forEach(add);
    if (index.includes(REGISTRIES_COMPLETE)) return [...found];
    const pattern = `${globEscape(this.global.scopes(0).slice(0, -1))}*`;
    const at = this.global.scopes(0).length - 1;
    try {
      let cursor = '0';
      do {
        const [next, keys] = await this.trip(this.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000));
        for (const k of keys) add(k.slice(at));
        cursor = next;
      } while (cursor !== '0');
      // Only what the scan found is marked complete: a registry written meanwhile is in the index already.
      await this.trip(
        this.redis.sadd(this.global.registries, ...[...found].map(String), REGISTRIES_COMPLETE),
      );
    } catch (err) {
      throw redisFailure('scope registry scan', err);
    }
    return [...found];
  }

  /**
   * Every partition's registry members, by SSCAN, all registries in one pipeline per page: one round trip when
   * each registry holds at most about 1,000 scopes (a small set comes whole), more for larger ones, without a
   * single reply holding a whole large set.
   */
  private async readRegistries(partitions: number[]): Promise<Map<number, string[]>> {
    const out = new Map<number, string[]>(partitions.map((p) => [p, []]));
    let pending = partitions.map((partition) => ({ partition, cursor: '0' }));
    const page = z.tuple([z.string(), z.array(z.string())]);
    while (pending.length) {
      const pipe = this.redis.pipeline();
      for (const { partition, cursor } of pending)
        pipe.sscan(this.global.scopes(partition), cursor, 'COUNT', 1000);
      const replies = await this.trip(execPipeline(pipe, 'scope registry read'));
      const next: typeof pending = [];
      replies.forEach((reply, i) => {
        const { partition } = pending[i]!;
        const [cursor, members] = page.parse(reply);
        out.get(partition)!.push(...members);
        if (cursor !== '0') next.push({ partition, cursor });
      });
      pending = next;
    }
    return out;
  }

  /** Whether the epoch marker still names `epoch` (a sweep checks it before each scope it acts on). */
  async epochIs(epoch: string): Promise<boolean> {
    let marker: string | null;
    try {
      marker = await this.trip(this.redis.get(this.global.epoch));
    } catch (err) {
      throw redisFailure('epoch marker read', err);
    }
    return marker === epoch;
  }

  /**
   * Retiring an idle scope, step 1 (retireClaim-4.lua): the publication lock, and the published dedupe_keys to
   * retract with `stamp`; `gone` when the scope has no state (a registration whose apply never wrote any); null
   * when it is not idle, or its lock is held.
   */
  async retireClaim(
    scope: Scope,
    token: string,
    idleMs: number,
    watch?: MarkerWatch,
  ): Promise<{ stamp: number; keys: string[] } | 'gone' | null> {
    const k = detectorKeys(this.prefix, scope);
    const pipe = this.redis.pipeline();
    invokeScript(
      pipe,
      'retireClaim',
      [k.meta, k.lock, k.published, k.stamp],
      [token, this.publicationLockMs, idleMs],
    );
    const [raw] = await this.execWatched(pipe, 'retireClaim', watch);
    const reply = parseScriptReply('retireClaim', raw, flatReply);
    if (reply[0] === 2) return 'gone';
    if (reply[0] !== 1) return null;
    return { stamp: Number(reply[1]), keys: reply.slice(2).map(String) };
  }

  /**
   * Retiring an idle scope, step 2 (retireFinish-15.lua), after its candidates were retracted: `retired` (state
   * deleted, and the scope taken out of `partitions`' registries unless new state came since), `active` (an
   * apply came in before the deletion: kept, and owed a publication), or `lost` (the lock ran out: nothing
   * done).
   */
  async retireFinish(
    scope: Scope,
    token: string,
    idleMs: number,
    partitions: readonly number[],
    watch?: MarkerWatch,
  ): Promise<'retired' | 'active' | 'lost'> {
    const k = detectorKeys(this.prefix, scope);
    const pipe = this.redis.pipeline();
    invokeScript(
      pipe,
      'retireFinish',
      [...stateKeys(k), k.lock, k.dirty, k.published, k.stamp],
      [token, idleMs, windowBuckets(this.params.lookback)],
    );
    const [raw] = await this.execWatched(pipe, 'retireFinish', watch);
    // An outcome, not a failure: parseScriptReply throws on every negative status.
    if (Array.isArray(raw) && raw[0] === -3) return 'lost';
    const reply = parseScriptReply('retireFinish', raw, z.tuple([z.number()]));
    if (reply[0] === 0) return 'active';
    await this.unregister(scope, partitions, watch);
    return 'retired';
  }

  /**
   * Takes a scope out of `partitions`' registries, then puts it back if it has state: an apply that made some
   * meanwhile registers the scope after its script (applyBatch's `fresh`), so whichever comes last, a scope with
   * state ends registered.
   */
  async unregister(scope: Scope, partitions: readonly number[], watch?: MarkerWatch): Promise<void> {
    const k = detectorKeys(this.prefix, scope);
    const member = scopeMember(scope);
    const removed = this.redis.pipeline();
    for (const p of partitions) {
      removed.srem(this.global.scopes(p), member);
      this.knownScopes.delete(`${p}\u001f${scopeId(scope)}`);
    }
    // In one pipeline, so in this order: the state check sees any apply that ran before a removal.
    const replies = await this.execWatched(removed.exists(k.meta), 'scope registry removal', watch);
    if (replies[replies.length - 1] === 1) {
      const back = this.redis.pipeline();
      this.register(
        back,
        partitions.map((partition) => ({ partition, scope })),
      );
      await this.execWatched(back, 'scope registry write', watch);
    }
  }

  /**
   * Takes the publication lock and reads the owed count, the published map and the snapshot in the same call;
   * `held` when another instance holds the lock (marked dirty unless `markDirty` is false, so the holder
   * publishes again), with the lock's remaining time (when its holder died, the lock is free after that).
   */
  async claimSnapshot(
    scope: Scope,
    token: string,
    ttlMs: number,
    markDirty = true,
  ): Promise<
    | { held: false; owed: number; stamp: number; published: Map<string, string>; snapshot: Snapshot }
    | { held: true; remainingMs: number; redisNowMs: number }
  > {
    const k = detectorKeys(this.prefix, scope);
    const reply = parseScriptReply(
      'claimSnapshot',
      await this.trip(
        invokeScript(
          this.redis,
          'claimSnapshot',
          [k.lock, k.dirty, k.published, k.support, k.tools, k.records, k.meta, k.stamp],
          [
            token,
            ttlMs,
            this.params.minOccurrences,
            this.params.requestTerms ? '1' : '0',
            windowBuckets(this.params.lookback),
            markDirty ? '1' : '0',
          ],
        ),
      ),
      flatReply,
    );
    if (reply[0] !== 1)
      return {
        held: true,
        remainingMs: Math.max(0, Number(reply[1] ?? 0)),
        redisNowMs: Number(reply[2] ?? 0),
      };
    const pairs = Number(reply[3]);
    const published = new Map<string, string>();
    for (let i = 0; i < pairs; i++) published.set(String(reply[4 + i * 2]), String(reply[5 + i * 2]));
    return {
      held: false,
      owed: Number(reply[1]),
      stamp: Number(reply[2]),
      published,
      snapshot: parseSnapshot(reply, 4 + pairs * 2),
    };
  }

  /** The next publication stamp of a scope whose lock this instance holds (a second pass; see lib/stamp.lua). */
  async stamp(scope: Scope): Promise<number> {
    const k = detectorKeys(this.prefix, scope);
    const reply = await this.trip(invokeScript(this.redis, 'stamp', [k.stamp], []));
    const n = Number(reply);
    if (!Number.isSafeInteger(n) || n <= 0)
      throw redisFailure('publication stamp', new Error(`bad reply ${String(reply)}`));
    return n;
  }

  /**
   * Gives up a publication lock this instance holds without recording anything (its send failed): the change
   * stays owed, and the next publication need not wait out the lock's TTL. False when the lock was not ours any
   * more.
   */
  async unlock(scope: Scope, token: string): Promise<boolean> {
    const k = detectorKeys(this.prefix, scope);
    const reply = z
      .union([z.literal(0), z.literal(1)])
      .parse(await this.trip(invokeScript(this.redis, 'unlock', [k.lock], [token])));
    return reply === 1;
  }

  /**
   * Records what was published, whose snapshot saw `owed`; `again` when the scope changed meanwhile and must be
   * published again (with the owed count the next snapshot sees at least).
   */
  async release(
    scope: Scope,
    token: string,
    ttlMs: number,
    owed: number,
    upserts: [string, string][],
    deletes: string[],
  ): Promise<{ again: boolean; owed: number }> {
    const k = detectorKeys(this.prefix, scope);
    const argv = [token, ttlMs, owed, upserts.length, ...upserts.flat(), ...deletes];
    const reply = parseScriptReply(
      'release',
      await this.trip(invokeScript(this.redis, 'release', [k.lock, k.dirty, k.published, k.meta], argv)),
      z.tuple([z.literal(1), z.number(), z.number()]),
      CODES,
    );
    return { again: reply[1] === 1, owed: reply[2] };
  }
}
