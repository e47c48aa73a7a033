import {
  buildArgs,
  canonicalJson,
  enumerateArgs,
  forgetIndexes,
  pathKey,
  sourceKey,
  type Binding,
  type BindingContext,
  type PastCall,
  type Path,
  type Source,
} from '../../../../../shared/core/bindings.js';
import type { TaskCompletedEvent, ToolCallEvent, UserMessageEvent } from '../../../../../schemas/index.js';
import { own, setOwn } from '../../../../../shared/core/own.js';
import { deeperThan } from '../../../../../shared/core/json-depth.js';
import { requestTermsOf } from '../../../../../shared/core/terms.js';
import { appliedBefore, type Position } from '../position.js';
import { failedOutput, mentionsRequest } from './outcome.js';
import { wilsonLower } from '../../../../../shared/core/wilson.js';
import { fnv64 } from './stats.js';

/**
 * The learned decider: per scope, statistics of the next tool after the last k tools (k = 1..K) and, for
 * each (context, next tool), which binding source reproduced each argument. A rule is (context, next tool,
 * bindings); every rule whose context matches a task proposes (silently, in shadow) and is scored against
 * what the agent did next; it becomes active once its Wilson lower bound clears the bar.
 *
 * Pure and deterministic: the same events in the same order give the same rules, states and proposals,
 * whether the service (state in Redis) or `paver predict` (state in memory) drives it.
 */

export interface LearnOptions {
  /** Longest context (last K tools). */
  maxK: number;
  /** Scored proposals a rule needs before it may become active (lifetime count). */
  minTrials: number;
  /** Wilson 95% lower bound a rule's precision must reach to be active (and stay active). */
  minPrecision: number;
  /**
   * Precision (the decayed point estimate) a rule must have to be active, and keep to stay active. The bound
   * alone lets a rule of 92–94% precision in once its trials are many (its bound then passes 0.9): on the
   * gpt-4o airline runs replayed ten times, active proposals came to 94.6% precision with the bound alone,
   * 96.8% with this at 0.95, while every synthetic case (perfect rules) keeps its coverage.
   */
  targetPrecision: number;
  /** Occurrences of (context, next tool) whose arguments every binding must have reproduced, at least. */
  minSupport: number;
  /** Effective window of a rule's precision: decayed counts forget at rate 1/window per trial. */
  window: number;
  /** Occurrence counts of a (context, tool) slot and of a context are halved past this. */
  maxCount: number;
  /** Bounds per scope (least recently used slots and contexts are evicted first, active rules last). */
  maxContexts: number;
  maxSlots: number;
  /** Sources kept per argument unit of a slot. */
  maxSourcesPerUnit: number;
  /** Calls remembered per task (bindings look back this far), ids remembered for idempotency. */
  historyPerTask: number;
  seenPerTask: number;
  /** Outputs/arguments larger than this (JSON characters) are not kept in the task history. */
  maxPayloadChars: number;
  /** Proposals scored per task step (best first). */
  maxPending: number;
  /**
   * Share of a context's next calls a tool needs for its bindings to be learned and its rule to propose at
   * all. Below half, since a rule proposes only where its bindings resolve (a list not walked to its end);
   * a third, not a quarter: the same synthetic cases are learned with 40% less state on the dev runs.
   */
  minShare: number;
  /**
   * Exceptions (see `Rule.ex`): a term of the user's request blocks a rule once the rule was scored at least
   * `exMin` times on requests holding it, with a hit rate below `exBelow`; at most `exTerms` terms per rule.
   * Two trials (two misses before any hit): a blocked trial is still scored for the term, so a term that met
   * misses by chance unblocks as the rule hits on requests holding it, and the rule's precision, counted on the
   * trials it was not blocked on, stays an unbiased estimate where misses have nothing to do with the request.
   * A synthetic domain where a third of the requests want something else: 18% of its lookups in 200 tasks (1
   * trial: 23%; 3 trials: 1.5%). The gpt-4o airline runs replayed ten times: 9.1% at 97.6% (1: 9.3%, 3: 9.0%).
   * One trial also blocked and demoted the only rule of the 30-run tau2 test fixture.
   */
  exMin: number;
  exBelow: number;
  exTerms: number;
  /**
   * Family evidence (see `ScopeState.fam`): a rule whose family is proven becomes active after this many
   * trials of its own, all but (1 − targetPrecision) of them hits, instead of the bound's ~35; 0 turns it off.
   * A recipe spread over several contexts (the same lookup after either of two searches, or after a retry)
   * is then proven as fast as one context would be. Eight: a context of 80% precision passes eight straight
   * hits one time in six, and leaves at its first miss (a demoted rule comes back on its own bound only).
   */
  familyTrials: number;
  /** Families kept per scope (the least recently scored go first). */
  maxFamilies: number;
}

export const DEFAULT_LEARN: LearnOptions = {
  maxK: 3,
  minTrials: 20,
  minPrecision: 0.9,
  targetPrecision: 0.95,
  minSupport: 3,
  window: 400,
  maxCount: 200,
  maxContexts: 2000,
  maxSlots: 4000,
  maxSourcesPerUnit: 6,
  historyPerTask: 32,
  seenPerTask: 128,
  maxPayloadChars: 32_768,
  maxPending: 24,
  minShare: 0.34,
  exMin: 2,
  exBelow: 0.5,
  exTerms: 24,
  familyTrials: 8,
  maxFamilies: 256,
};

export type RuleState = 'shadow' | 'active' | 'demoted';

export interface Rule {
  id: string;
  bindings: Binding[];
  state: RuleState;
  /** Lifetime scored proposals and hits. */
  trials: number;
  hits: number;
  /** Decayed counts (window) behind the precision and its bound. */
  dn: number;
  dh: number;
  /** ts of the event that created it / last changed its state. */
  created: number;
  changed: number;
  /**
   * Exceptions: request term (its hash) → [trials, hits] of this rule on tasks whose request holds the term, counted on
   * every trial (blocked or not) once the term was met in a miss. A rule that holds in general but misses
   * whenever the user asks for something else (a lookup after the user's profile, when the user wants to
   * book) stops proposing on such requests, and is proven on the others. Absent: none yet.
   */
  ex?: Record<string, [number, number]>;
}

export interface Slot {
  ctx: string;
  k: number;
  tool: string;
  /** Occurrences of this tool after this context (halved past maxCount). */
  n: number;
  /** Argument unit signatures (sorted unit paths) → occurrences. */
  sigs: Record<string, number>;
  /**
   * Occurrences that repeated an earlier call of the task exactly (same tool and arguments; halved with `n`).
   * Agents rarely repeat a call verbatim, so where this slot never does, a proposal that would is not made.
   * Absent in state written before it was kept: read as 0.
   */
  rep?: number;
  /** Unit path key → source key → occurrences it reproduced the value. */
  units: Record<string, Record<string, number>>;
  rule: Rule | null;
  at: number;
}

export interface CtxStat {
  /** Occurrences of the context; next tool ('' = the task ended) → count. */
  n: number;
  next: Record<string, number>;
  at: number;
}

export interface ScopeState {
  v: 2;
  /** Events applied (the recency clock for eviction). */
  clock: number;
  /**
   * Counts of contexts, slots and active rules in the whole scope, kept by the core: a store may load only the
   * contexts a batch touches, and these decide (deterministically) when eviction must see everything.
   */
  nCtx: number;
  nSlots: number;
  nActive: number;
  ctx: Record<string, CtxStat>;
  slots: Record<string, Slot>;
  /**
   * Families: a family is a next tool with its bindings, in any context (`familyKey`) → [decayed trials,
   * decayed hits, lifetime trials, clock when last scored] of the proposals its rules made, one trial per scored call whatever the
   * number of its rules that proposed it (the contexts k = 1..K of one call are one piece of evidence).
   * Absent in state written before it was kept, and until a rule is scored.
   */
  fam?: Record<string, Family>;
}

export type Family = [dn: number, dh: number, n: number, at: number];

export const newScopeState = (): ScopeState => ({
  v: 2,
  clock: 0,
  nCtx: 0,
  nSlots: 0,
  nActive: 0,
  ctx: {},
  slots: {},
});

export interface Proposal {
  tool: string;
  args: Record<string, unknown>;
  origin: 'typed' | 'learned';
  state: 'active' | 'shadow';
  rule_id: string | null;
  confidence: number | null;
  trials: number;
  k: number;
}

interface Pending {
  slot: string;
  id: string;
  tool: string;
  fp: string;
  /** Blocked by an exception: scored for the rule's exceptions only, never proposed. */
  b?: 1;
}

export interface LearnTask {
  seen: string[];
  /** Where the task's last applied event stood (see `appliedBefore`); absent offline and in older state. */
  at?: Position;
  calls: PastCall[];
  user: string | null;
  /**
   * The task's latest user message after the first (the `said` binding source: what the user answered when the
   * agent asked). Absent until there is one, and in state written before it was kept.
   */
  said?: string;
  /** The step of the task's last call (what a record made after a later user message names). */
  step?: number;
  /** Every learned proposal for the next call (scored when it comes). */
  pending: Pending[];
  /** The best proposal for the next call (what the runtime was told). */
  best: Proposal | null;
  /**
   * The task completed (a `task_completed` applied, and no call since): it has no next call, so a later user
   * message proposes nothing. Absent while it runs, and in state written before it was kept.
   */
  ended?: true;
}

export const newLearnTask = (): LearnTask => ({ seen: [], calls: [], user: null, pending: [], best: null });

export interface Scored {
  rule_id: string;
  tool: string;
  state: RuleState;
  hit: boolean;
}

export interface StepResult {
  duplicate: boolean;
  /** The best proposal held for this call before reading it (null for a task_completed or a first call). */
  held: Proposal | null;
  /** Outcome of `held` (undefined when there was none). */
  heldHit?: boolean;
  /** The best proposal for the task's next call, after this event. */
  next: Proposal | null;
  /** Every learned proposal scored by this event (for rule statistics). */
  scored: Scored[];
  /** Rules whose state changed. */
  transitions: { rule_id: string; tool: string; from: RuleState; to: RuleState }[];
  task: LearnTask;
}

/** Validates built arguments against a catalog schema: true/false, or undefined when the tool is unknown. */
export type ArgsValidator = (
  scope: { tenant_id: string; agent_id: string },
  tool: string,
  args: Record<string, unknown>,
) => boolean | undefined;

const SEP = '\u001f';
const SLOT_SEP = '\u001e';
export const slotKey = (ctx: string, tool: string) => `${ctx}${SLOT_SEP}${tool}`;
/** The context part of a slot key. */
export const slotContext = (sk: string) => sk.slice(0, sk.lastIndexOf(SLOT_SEP));
const argsFp = (args: Record<string, unknown> | undefined) => fnv64(canonicalJson(args ?? {}));
/** Fingerprints of earlier calls' arguments, memoised per object (derived data only: results stay deterministic). */
const pastFps = new WeakMap<object, string>();
function pastFp(c: PastCall): string {
  if (!c.args) return argsFp(undefined);
  let fp = pastFps.get(c.args);
  if (fp === undefined) pastFps.set(c.args, (fp = argsFp(c.args)));
  return fp;
}
/** Whether a call of `tool` with arguments fingerprinted `fp` would repeat one of `calls` exactly. */
const repeats = (calls: readonly PastCall[], tool: string, fp: string) =>
  calls.some((c) => c.tool === tool && pastFp(c) === fp);
/** A slot repeats calls often enough that a proposal repeating one is plausible (polling, retries). */
const repeatsOften = (slot: Slot) => (slot.rep ?? 0) * 2 >= slot.n;

/** Marks a context whose last call failed: what follows a failure has statistics (and rules) of its own. */
const FAILED = `${SEP}!failed`;
/**
 * Marks refining a context by whether its last output mentions a word of the user's request (see
 * `mentionsRequest`). Both refinements are kept beside the plain context, not instead of it: a rule that
 * holds either way is proven on all its trials (no slower promotion), and one that holds on one side only
 * (a list walk that goes on while records do not mention what the user asked for) can be proven there.
 */
const MENTIONS = `${SEP}!mentions`;
const QUIET = `${SEP}!quiet`;

function contexts(
  calls: readonly PastCall[],
  maxK: number,
  userText: string | null,
): { key: string; k: number }[] {
  const out: { key: string; k: number }[] = [];
  if (calls.length === 0) return out;
  const lastCall = calls[calls.length - 1]!;
  const last = lastCall.observation;
  // The producer's own word first (the event's `status`), else what the output says.
  const failed = lastCall.failed ?? failedOutput(last);
  // Without a request there is nothing to mention: the refinement would only copy the plain context.
  const refine = failed || !userText ? '' : mentionsRequest(last, userText) ? MENTIONS : QUIET;
  for (let k = 1; k <= Math.min(maxK, calls.length); k++) {
    const tools = calls
      .slice(calls.length - k)
      .map((c) => c.tool)
      .join(SEP);
    out.push({ key: tools + (failed ? FAILED : ''), k });
    if (refine) out.push({ key: tools + refine, k });
  }
  return out;
}

const confidence = (r: Rule) => wilsonLower(r.dh, r.dn);

/**
 * Request terms per text, as 32-bit hashes: rules outlive tasks (no TTL), so they keep no word of what users
 * wrote. Memoised (derived data only: results stay deterministic); bounded.
 */
const termsMemo = new Map<string, readonly string[]>();
function termsOf(text: string | null): readonly string[] {
  if (!text) return [];
  let t = termsMemo.get(text);
  if (t === undefined) {
    if (termsMemo.size >= 1024) termsMemo.clear();
    t = [...new Set(requestTermsOf(text).map((w) => fnv64(w).slice(0, 8)))];
    termsMemo.set(text, t);
  }
  return t;
}

/** A term blocks once the rule's trials on requests holding it are enough and mostly misses. */
const blocks = (s: [number, number], opts: LearnOptions) => s[0] >= opts.exMin && s[1] < s[0] * opts.exBelow;

/** Whether an exception of the rule blocks it for a request with these terms. */
function blocked(r: Rule, terms: readonly string[], opts: LearnOptions): boolean {
  const ex = r.ex;
  if (!ex) return false;
  for (const t of terms) {
    const s = ex[t];
    if (s && blocks(s, opts)) return true;
  }
  return false;
}

/**
 * Counts a trial of the rule for each term of the request. A term is first kept at a miss (terms met only in
 * hits could never block); when the rule keeps `exTerms` already, the kept term least likely to block (highest
 * hit rate, then fewest trials, then the oldest) gives way, unless it blocks now.
 */
function noteExceptions(r: Rule, terms: readonly string[], hit: boolean, opts: LearnOptions): void {
  if (hit && !r.ex) return;
  for (const t of terms) {
    let s = r.ex?.[t];
    if (!s) {
      if (hit) continue;
      const ex = (r.ex ??= {});
      const keys = Object.keys(ex);
      if (keys.length >= opts.exTerms) {
        let w = 0;
        for (let j = 1; j < keys.length; j++) {
          const a = ex[keys[j]!]!;
          const b = ex[keys[w]!]!;
          const ra = a[1] / a[0];
          const rb = b[1] / b[0];
          if (ra > rb || (ra === rb && a[0] < b[0])) w = j;
        }
        if (blocks(ex[keys[w]!]!, opts)) continue;
        delete ex[keys[w]!];
      }
      s = ex[t] = [0, 0];
    }
    s[0]++;
    if (hit) s[1]++;
    if (s[0] > opts.maxCount) {
      s[0] /= 2;
      s[1] /= 2;
    }
  }
}

/** A rule's family: its next tool and bindings, whatever the context. */
export function familyKey(tool: string, bindings: readonly Binding[]): string {
  // Asked for every scored proposal: memoised per bindings array (a rule's never change; derived data only).
  const m = familyKeys.get(bindings);
  if (m?.tool === tool) return m.key;
  const key = fnv64(`${tool}${SLOT_SEP}${canonicalJson(bindings)}`);
  familyKeys.set(bindings, { tool, key });
  return key;
}
const familyKeys = new WeakMap<readonly Binding[], { tool: string; key: string }>();

/** Proven as a rule is (trials, bound, point estimate), over every context where its rules proposed. */
function familyProven(f: Family | undefined, opts: LearnOptions): boolean {
  return (
    f !== undefined &&
    f[2] >= opts.minTrials &&
    wilsonLower(f[1], f[0]) >= opts.minPrecision &&
    f[1] / f[0] >= opts.targetPrecision
  );
}

function score(
  scope: ScopeState,
  r: Rule,
  tool: string,
  hit: boolean,
  ts: number,
  opts: LearnOptions,
): RuleState {
  const keep = 1 - 1 / opts.window;
  r.dn = r.dn * keep + 1;
  r.dh = r.dh * keep + (hit ? 1 : 0);
  r.trials++;
  if (hit) r.hits++;
  const from = r.state;
  const lb = confidence(r);
  // The bound says the precision is proven; the point estimate says it is high enough. A rule whose bound
  // clears the bar on many trials can still be a 92% rule: active, it would take the whole below the target.
  const enough = r.dh / r.dn >= opts.targetPrecision;
  const proven = r.trials >= opts.minTrials && lb >= opts.minPrecision;
  // A head start for a rule never demoted: its family is proven elsewhere and its own trials agree.
  const byFamily =
    opts.familyTrials > 0 &&
    r.state !== 'demoted' &&
    r.trials >= opts.familyTrials &&
    familyProven(scope.fam?.[familyKey(tool, r.bindings)], opts);
  // An active rule with too few trials for any record of its own to prove it (all hits would not clear the
  // bound) is not demoted for lacking that proof: it came in on its family's, which may have gone since
  // (evicted among many, or a writer that does not keep families). Its precision still demotes it.
  const provable = r.trials >= opts.minTrials && wilsonLower(r.dn, r.dn) >= opts.minPrecision;
  if (r.state !== 'active' && (proven || byFamily) && enough) r.state = 'active';
  else if (r.state === 'active' && (!enough || !(proven || byFamily || !provable))) r.state = 'demoted';
  if (r.state !== from) {
    r.changed = ts;
    scope.nActive += (r.state === 'active' ? 1 : 0) - (from === 'active' ? 1 : 0);
  }
  return from;
}

function halveIfOver(counts: Record<string, number>, total: number, max: number): boolean {
  if (total <= max) return false;
  for (const k of Object.keys(counts)) counts[k] = counts[k]! / 2;
  return true;
}

function trimPayload(v: unknown, max: number): unknown {
  if (v === undefined) return undefined;
  return JSON.stringify(v).length > max ? undefined : v;
}

/** Best source per unit of the slot's most common signature, or null when a unit has too little support. */
function bestBindings(slot: Slot, opts: LearnOptions): { bindings: Binding[]; counts: number[] } | null {
  let sig: string | null = null;
  let top = -1;
  for (const [s, c] of Object.entries(slot.sigs))
    if (c > top || (c === top && sig !== null && s < sig)) [sig, top] = [s, c];
  if (sig === null) return null;
  const paths = JSON.parse(sig) as Path[];
  const bindings: Binding[] = [];
  const counts: number[] = [];
  for (const p of paths) {
    const srcs = slot.units[pathKey(p)];
    if (!srcs) return null;
    let best: string | null = null;
    let bc = 0;
    // Insertion order is preference order (enumerateSources sorts), so `>` keeps the preferred on ties.
    for (const [s, c] of Object.entries(srcs)) if (c > bc) [best, bc] = [s, c];
    if (best === null || bc < opts.minSupport) return null;
    bindings.push({ path: p, source: JSON.parse(best) as Source });
    counts.push(bc);
  }
  return { bindings, counts };
}

function refreshRule(scope: ScopeState, slot: Slot, ts: number, opts: LearnOptions): void {
  if (slot.n < opts.minSupport) return;
  const best = bestBindings(slot, opts);
  if (!best) return;
  const id = fnv64(`${slot.ctx}${SLOT_SEP}${slot.tool}${SLOT_SEP}${canonicalJson(best.bindings)}`);
  if (slot.rule?.id === id) return;
  if (slot.rule) {
    // Hysteresis: keep the current bindings unless a unit now has a strictly better-supported source.
    const cur = slot.rule.bindings;
    const curCounts = cur.map((b) => slot.units[pathKey(b.path)]?.[sourceKey(b.source)] ?? 0);
    const samePaths =
      canonicalJson(cur.map((b) => b.path)) === canonicalJson(best.bindings.map((b) => b.path));
    if (samePaths && curCounts.every((c, i) => c >= best.counts[i]!)) return;
    if (
      !samePaths &&
      Math.min(...curCounts, Infinity) >= Math.min(...best.counts, Infinity) &&
      cur.length > 0
    )
      return;
  }
  if (slot.rule?.state === 'active') scope.nActive--;
  slot.rule = {
    id,
    bindings: best.bindings,
    state: 'shadow',
    trials: 0,
    hits: 0,
    dn: 0,
    dh: 0,
    created: ts,
    changed: ts,
  };
}

function learnOccurrence(
  scope: ScopeState,
  ctxs: { key: string; k: number }[],
  bctx: BindingContext,
  e: ToolCallEvent,
  repeat: boolean,
  opts: LearnOptions,
): void {
  // Next-tool statistics first: bindings are learned only where the tool is a common next call (share ≥
  // minShare); elsewhere no rule could be proven, so its slot would be work and bytes for nothing.
  const learnAt: { key: string; k: number }[] = [];
  for (const { key, k } of ctxs) {
    // Context keys of one tool are its name, and `next` is keyed by tool names: own properties only.
    let c = own(scope.ctx, key);
    if (!c) {
      c = setOwn(scope.ctx, key, { n: 0, next: {}, at: 0 });
      scope.nCtx++;
    }
    c.n++;
    setOwn(c.next, e.tool, (own(c.next, e.tool) ?? 0) + 1);
    c.at = scope.clock;
    if (halveIfOver(c.next, c.n, opts.maxCount)) c.n /= 2;
    if (c.n >= opts.minSupport && own(c.next, e.tool)! >= c.n * opts.minShare) learnAt.push({ key, k });
  }
  if (learnAt.length === 0) return;
  const units = enumerateArgs(bctx, e.tool, e.args);
  const sig = canonicalJson(units.map((u) => u.path));
  const unitKeys = units.map((u) => ({ path: pathKey(u.path), sources: u.keys }));
  for (const { key, k } of learnAt) {
    const sk = slotKey(key, e.tool);
    if (!scope.slots[sk]) scope.nSlots++;
    const slot = (scope.slots[sk] ??= {
      ctx: key,
      k,
      tool: e.tool,
      n: 0,
      sigs: {},
      units: {},
      rule: null,
      at: 0,
    });
    slot.n++;
    if (repeat) slot.rep = (slot.rep ?? 0) + 1;
    slot.at = scope.clock;
    slot.sigs[sig] = (slot.sigs[sig] ?? 0) + 1;
    for (const u of unitKeys) {
      const srcs = (slot.units[u.path] ??= {});
      // The unit's keys in insertion order (Object.keys order), read once and kept in step below.
      let keys: string[] | null = null;
      for (const key2 of u.sources) {
        if (key2 in srcs) srcs[key2]! += 1;
        else {
          keys ??= Object.keys(srcs);
          if (keys.length >= opts.maxSourcesPerUnit) {
            // Full: a new source replaces the weakest one only if that one has proven nothing yet.
            let weakest = 0;
            for (let j = 1; j < keys.length; j++) if (srcs[keys[j]!]! < srcs[keys[weakest]!]!) weakest = j;
            if (srcs[keys[weakest]!]! > 1) continue;
            delete srcs[keys[weakest]!];
            keys.splice(weakest, 1);
          }
          srcs[key2] = 1;
          keys.push(key2);
        }
      }
    }
    if (halveIfOver(slot.sigs, slot.n, opts.maxCount)) {
      slot.n /= 2;
      if (slot.rep) slot.rep /= 2;
      for (const srcs of Object.values(slot.units)) for (const kk of Object.keys(srcs)) srcs[kk]! /= 2;
    }
    // The current rule reproduced this occurrence: no source can have overtaken its bindings.
    const cur = slot.rule;
    const reproduced =
      cur !== null &&
      cur.bindings.length === units.length &&
      cur.bindings.every((b, i) => {
        const u = unitKeys[i]!;
        return u.path === pathKey(b.path) && u.sources.includes(sourceKey(b.source));
      });
    if (!reproduced) refreshRule(scope, slot, e.ts, opts);
  }
}

/** How far the counts may pass their bounds before eviction runs: it sorts the whole scope, so not every event. */
const slack = (max: number) => Math.ceil(max / 4);

/**
 * Whether eviction can run while applying `events` more events to a scope with these counts: a store that
 * loads only part of a scope loads all of it then.
 */
export function evictionDue(
  counts: Pick<ScopeState, 'nCtx' | 'nSlots'>,
  events: number,
  opts: LearnOptions,
): boolean {
  // Each event adds at most two contexts (plain and refined) and two slots per k.
  const grow = events * opts.maxK * 2;
  return (
    counts.nCtx + grow > opts.maxContexts + slack(opts.maxContexts) ||
    counts.nSlots + grow > opts.maxSlots + slack(opts.maxSlots)
  );
}

/**
 * `evictionDue` once the contexts a batch touches are loaded (`loaded`): only the contexts and slots it can
 * create (named by `contextsTouched`, with `slots` and how often each comes, and not in the loaded state, which
 * holds every slot of a loaded context) can raise the counts. A slot is made only for a tool whose share of its
 * context's next calls reaches `minShare`: even if all `m` of the batch's calls came first, a share of
 * (next + m) / (n + m) short of it makes none, as long as the context's counts are not halved in the batch
 * (after a halving each new call weighs twice): a context that `events` more calls could take past `maxCount`
 * is not judged by its share. A batch over what the scope holds then never needs the whole scope, however
 * near its bounds the scope is, where `evictionDue` must assume every event adds to them.
 */
export function evictionDueLoaded(
  counts: Pick<ScopeState, 'nCtx' | 'nSlots'>,
  loaded: Pick<ScopeState, 'ctx' | 'slots'>,
  ctxs: Iterable<string>,
  slots: ReadonlyMap<string, number>,
  events: number,
  opts: LearnOptions,
): boolean {
  let newCtx = 0;
  for (const k of ctxs) if (!Object.hasOwn(loaded.ctx, k)) newCtx++;
  let newSlots = 0;
  for (const [sk, m] of slots) {
    if (Object.hasOwn(loaded.slots, sk)) continue;
    const ctx = slotContext(sk);
    const c = own(loaded.ctx, ctx);
    // A margin for the halved (fractional) counts' rounding: when in doubt, the slot counts as possible.
    if (
      c &&
      c.n + events <= opts.maxCount &&
      (own(c.next, sk.slice(ctx.length + 1)) ?? 0) + m < opts.minShare * (c.n + m) - 1e-6
    )
      continue;
    newSlots++;
  }
  return (
    counts.nCtx + newCtx > opts.maxContexts + slack(opts.maxContexts) ||
    counts.nSlots + newSlots > opts.maxSlots + slack(opts.maxSlots)
  );
}

function deleteSlot(scope: ScopeState, sk: string): void {
  const slot = scope.slots[sk];
  if (!slot) return;
  if (slot.rule?.state === 'active') scope.nActive--;
  scope.nSlots--;
  delete scope.slots[sk];
}

/** Back down to the bounds, least recently used first (active rules last); needs the whole scope. */
function evict(scope: ScopeState, opts: LearnOptions): void {
  // Sort keys were read out once per entry (not per comparison): the order is the same total order.
  if (scope.nSlots > opts.maxSlots + slack(opts.maxSlots)) {
    const order = Object.entries(scope.slots)
      .map(([k, s]) => ({ k, active: s.rule?.state === 'active' ? 1 : 0, at: s.at }))
      .sort((a, b) => a.active - b.active || a.at - b.at || (a.k < b.k ? -1 : 1));
    for (const { k } of order.slice(0, order.length - opts.maxSlots)) deleteSlot(scope, k);
  }
  if (scope.nCtx > opts.maxContexts + slack(opts.maxContexts)) {
    const order = Object.entries(scope.ctx)
      .map(([k, c]) => ({ k, at: c.at }))
      .sort((a, b) => a.at - b.at || (a.k < b.k ? -1 : 1));
    for (const { k } of order.slice(0, order.length - opts.maxContexts)) {
      for (const t of Object.keys(scope.ctx[k]!.next)) deleteSlot(scope, slotKey(k, t));
      delete scope.ctx[k];
      scope.nCtx--;
    }
  }
}

const rank = (p: Proposal) => (p.state === 'active' ? 1 : 0);
/** How specific a proposal's context is: longer, then refined (a subset of its plain context's occurrences). */
const specificity = (p: Proposal & { refined?: boolean }) => p.k * 2 + (p.refined ? 1 : 0);
/**
 * Active before shadow; between active proposals, the more specific context first (back-off: a longer or
 * refined context's proven rule answers for the situations it covers, where the shorter context's rule, when
 * it proposes otherwise, is the one that misses: its precision there is at most the complement of the
 * specific rule's); then the higher bound, then the longer context, then the rule id.
 */
export function better(a: Proposal & { refined?: boolean }, b: Proposal & { refined?: boolean }): boolean {
  if (rank(a) !== rank(b)) return rank(a) > rank(b);
  if (rank(a) === 1 && specificity(a) !== specificity(b)) return specificity(a) > specificity(b);
  if ((a.confidence ?? 0) !== (b.confidence ?? 0)) return (a.confidence ?? 0) > (b.confidence ?? 0);
  if (a.k !== b.k) return a.k > b.k;
  return (a.rule_id ?? '') < (b.rule_id ?? '');
}

function propose(
  scope: ScopeState,
  who: { tenant_id: string; agent_id: string },
  task: LearnTask,
  opts: LearnOptions,
  validate?: ArgsValidator,
): { pending: Pending[]; best: Proposal | null } {
  const bctx: BindingContext = { calls: task.calls, userText: task.user ?? undefined, saidText: task.said };
  const terms = termsOf(task.user);
  const cands: (Proposal & { slot: string; fp: string; refined: boolean; blocked: boolean })[] = [];
  for (const { key, k } of contexts(task.calls, opts.maxK, task.user)) {
    const refined = key.endsWith(MENTIONS) || key.endsWith(QUIET);
    const c = own(scope.ctx, key);
    if (!c) continue;
    for (const tool of Object.keys(c.next)) {
      // A rule proposes only where its bindings resolve, so its precision can exceed its tool's share (a walk
      // over a list goes on while an element is left: after a call of a short list's walk, the next call is
      // the walk's less often than not, but always while one is left). Far below that share it cannot be
      // proven: such a tool is neither proposed nor scored (this bounds the work to 1/minShare per context).
      if (tool === '' || c.next[tool]! < c.n * opts.minShare) continue;
      const sk = slotKey(key, tool);
      const slot = scope.slots[sk];
      const rule = slot?.rule;
      if (!slot || !rule) continue;
      const built = buildArgs(bctx, tool, rule.bindings);
      if (!built.ok) continue;
      if (validate?.(who, tool, built.args) === false) continue;
      const fp = argsFp(built.args);
      if (!repeatsOften(slot) && repeats(task.calls, tool, fp)) continue;
      cands.push({
        tool,
        args: built.args,
        origin: 'learned',
        state: rule.state === 'active' ? 'active' : 'shadow',
        rule_id: rule.id,
        confidence: confidence(rule),
        trials: rule.trials,
        k,
        slot: sk,
        fp,
        refined,
        blocked: blocked(rule, terms, opts),
      });
    }
  }
  // Blocked candidates last: they are scored (for their exceptions) but never the proposal.
  cands.sort((a, b) =>
    a.blocked !== b.blocked ? (a.blocked ? 1 : -1) : better(a, b) ? -1 : better(b, a) ? 1 : 0,
  );
  const kept = cands.slice(0, opts.maxPending);
  const top = kept[0]?.blocked ? undefined : kept[0];
  return {
    pending: kept.map((c) => {
      const p: Pending = { slot: c.slot, id: c.rule_id!, tool: c.tool, fp: c.fp };
      if (c.blocked) p.b = 1;
      return p;
    }),
    best: top
      ? {
          tool: top.tool,
          args: top.args,
          origin: 'learned',
          state: top.state,
          rule_id: top.rule_id,
          confidence: top.confidence,
          trials: top.trials,
          k: top.k,
        }
      : null,
  };
}

function scorePending(
  scope: ScopeState,
  task: LearnTask,
  actual: { tool: string; fp: string } | null,
  ts: number,
  opts: LearnOptions,
  out: StepResult,
): void {
  const terms = termsOf(task.user);
  if (opts.familyTrials > 0) scoreFamilies(scope, task, actual, opts);
  for (const p of task.pending) {
    const slot = scope.slots[p.slot];
    const rule = slot?.rule;
    if (!rule || rule.id !== p.id) continue;
    const hit = actual !== null && actual.tool === p.tool && actual.fp === p.fp;
    noteExceptions(rule, terms, hit, opts);
    if (p.b) continue;
    const from = score(scope, rule, p.tool, hit, ts, opts);
    out.scored.push({ rule_id: rule.id, tool: p.tool, state: from, hit });
    if (rule.state !== from) out.transitions.push({ rule_id: rule.id, tool: p.tool, from, to: rule.state });
  }
}

/**
 * One trial per family among the call's pending proposals (not blocked), before the rules are scored, so that
 * a rule's own trial counts in its family when its promotion is judged. Past `maxFamilies` (by a quarter) the
 * least recently scored go (as slots and contexts do), then by key: the same state gives the same choice
 * everywhere. An active rule's family is scored with it, so it is never the one to go.
 */
function scoreFamilies(
  scope: ScopeState,
  task: LearnTask,
  actual: { tool: string; fp: string } | null,
  opts: LearnOptions,
): void {
  const keep = 1 - 1 / opts.window;
  let done: Set<string> | null = null;
  for (const p of task.pending) {
    if (p.b) continue;
    const rule = scope.slots[p.slot]?.rule;
    if (!rule || rule.id !== p.id) continue;
    const fk = familyKey(p.tool, rule.bindings);
    if (done?.has(fk)) continue;
    (done ??= new Set()).add(fk);
    const hit = actual !== null && actual.tool === p.tool && actual.fp === p.fp;
    const f = ((scope.fam ??= {})[fk] ??= [0, 0, 0, 0]);
    f[0] = f[0] * keep + 1;
    f[1] = f[1] * keep + (hit ? 1 : 0);
    f[2]++;
    f[3] = scope.clock;
  }
  const fam = scope.fam;
  if (!fam) return;
  const keys = Object.keys(fam);
  if (keys.length <= opts.maxFamilies + slack(opts.maxFamilies)) return;
  keys.sort((a, b) => fam[a]![3] - fam[b]![3] || (a < b ? -1 : 1));
  for (const k of keys.slice(0, keys.length - opts.maxFamilies)) delete fam[k];
}

/** How deep `structured` looks for JSON text inside an output (MCP's `content[i].text` is at depth 2). */
const JSON_TEXT_DEPTH = 4;

/**
 * An output handed over as JSON text (most agent frameworks pass a tool's result on as a string; MCP wraps it
 * in `content[i].text`) read as the JSON it holds, so that its fields and lists can be binding sources, as
 * when the producer publishes it parsed, also when encoded twice. Any other string (plain text, a number, an
 * error sentence) stays as it is. Objects are copied only where a string inside them was read.
 */
function structured(v: unknown, depth = 0): unknown {
  if (typeof v === 'string') {
    let i = 0;
    while (i < v.length && (v[i] === ' ' || v[i] === '\n' || v[i] === '\r' || v[i] === '\t')) i++;
    // JSON text encoded twice (a framework that serialises a result already serialised): the JSON text of a
    // string that holds an object or a list, read as that object or list; any other quoted string stays as is.
    if (v[i] === '"' && depth < JSON_TEXT_DEPTH) {
      let inner: unknown;
      try {
        inner = JSON.parse(v);
      } catch {
        return v;
      }
      if (typeof inner !== 'string') return v;
      const x = structured(inner, depth + 1);
      return x === inner ? v : x;
    }
    if (v[i] !== '{' && v[i] !== '[') return v;
    try {
      const parsed = JSON.parse(v) as unknown;
      // Too deep to walk or write back (the event passed the boundary's depth check as a string).
      return parsed !== null && typeof parsed === 'object' && !deeperThan(parsed) ? parsed : v;
    } catch {
      return v;
    }
  }
  if (v === null || typeof v !== 'object' || depth >= JSON_TEXT_DEPTH) return v;
  if (Array.isArray(v)) {
    let out: unknown[] | null = null;
    for (let i = 0; i < v.length; i++) {
      const x = structured(v[i], depth + 1);
      if (x !== v[i]) (out ??= v.slice())[i] = x;
    }
    return out ?? v;
  }
  let out: Record<string, unknown> | null = null;
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
    const y = structured(x, depth + 1);
    if (y !== x) (out ??= { ...(v as Record<string, unknown>) })[k] = y;
  }
  return out ?? v;
}

/**
 * Whether a call failed, as the learner judges the last call of a context (`!failed`): the producer's `status`
 * when it sets one (`ok` is trusted too), otherwise what its output says (`failedOutput`, on the output read as
 * the JSON it holds). Here on the whole output: the gates on the previous step read it (see `prevCall`).
 */
export const callFailed = (e: Pick<ToolCallEvent, 'status' | 'observation'>): boolean =>
  e.status ? e.status === 'error' : failedOutput(structured(e.observation));

/** What a task remembers of a call: its tool, and its arguments and output unless they are too large. */
function pastCall(e: ToolCallEvent, opts: LearnOptions): PastCall {
  const call: PastCall = { tool: e.tool };
  const args = trimPayload(e.args, opts.maxPayloadChars) as Record<string, unknown> | undefined;
  const obs = structured(trimPayload(e.observation, opts.maxPayloadChars));
  if (args !== undefined) call.args = args;
  if (obs !== undefined) call.observation = obs;
  if (e.status) call.failed = e.status === 'error';
  return call;
}

/**
 * Every context key that applying `events` (one task's, in order, each at `positions[i]` when the caller knows
 * it) to `task` can read or write: the contexts of its pending proposals and of its calls before and after each
 * event. A store that loads a scope in part loads these. Events the steps would take as already applied (by
 * position or event id, as they judge it) change nothing here either: a redelivered event counted as applied
 * would shift the calls behind the next ones and name contexts other than those they touch.
 */
export function contextsTouched(
  task: LearnTask,
  events: readonly (ToolCallEvent | TaskCompletedEvent | UserMessageEvent)[],
  opts: LearnOptions,
  positions?: readonly (Position | undefined)[],
  slots?: Map<string, number>,
): Set<string> {
  const keys = new Set<string>(task.pending.map((p) => slotContext(p.slot)));
  let calls = task.calls;
  let user = task.user;
  let seen = task.seen;
  let at = task.at;
  // The contexts of the calls so far (as refined by the request so far): a call's slots pair its tool with them.
  let cur = contexts(calls, opts.maxK, user);
  for (const { key } of cur) keys.add(key);
  // As the steps judge and record each event (see stepUserMessage, stepToolCall, stepTaskCompleted).
  events.forEach((e, i) => {
    const pos = positions?.[i];
    if (appliedBefore(at, pos) || seen.includes(e.event_id)) return;
    seen = seenWith(seen, e.event_id, e.type === 'user_message' && user === null, opts);
    at = pos ?? at;
    // The request (the task's first user message) refines contexts from there on; a later message does not.
    if (e.type === 'user_message') {
      if (user !== null) return;
      user = e.text;
    } else if (e.type === 'tool_call') {
      // The slots this call can create: its tool after each context of the calls before it (with how often).
      if (slots)
        for (const { key } of cur) {
          const sk = slotKey(key, e.tool);
          slots.set(sk, (slots.get(sk) ?? 0) + 1);
        }
      calls = [...calls, pastCall(e, opts)].slice(-opts.historyPerTask);
    } else return;
    cur = contexts(calls, opts.maxK, user);
    for (const { key } of cur) keys.add(key);
  });
  return keys;
}

/** A tool_call: score what was proposed for it, learn from it, propose the task's next call. Mutates `scope`. */
export function stepToolCall(
  scope: ScopeState,
  task: LearnTask,
  e: ToolCallEvent,
  opts: LearnOptions = DEFAULT_LEARN,
  validate?: ArgsValidator,
  pos?: Position,
): StepResult {
  const out = stepStart(task);
  if (appliedBefore(task.at, pos) || task.seen.includes(e.event_id))
    return { ...out, held: null, duplicate: true };
  scope.clock++;
  const fp = argsFp(e.args);
  if (task.best) out.heldHit = task.best.tool === e.tool && argsFp(task.best.args) === fp;
  scorePending(scope, task, { tool: e.tool, fp }, e.ts, opts, out);
  const bctx: BindingContext = { calls: task.calls, userText: task.user ?? undefined, saidText: task.said };
  const ctxs = contexts(task.calls, opts.maxK, task.user);
  if (ctxs.length > 0) learnOccurrence(scope, ctxs, bctx, e, repeats(task.calls, e.tool, fp), opts);
  // Eviction sorts the scope: it runs once the counts pass their bounds by a quarter, so its cost is amortised,
  // and the decision depends on the counts alone (state), so every store makes it at the same event.
  evict(scope, opts);
  const next: LearnTask = {
    seen: [...task.seen, e.event_id].slice(-opts.seenPerTask),
    calls: [...task.calls, pastCall(e, opts)].slice(-opts.historyPerTask),
    user: task.user,
    ...(task.said !== undefined ? { said: task.said } : {}),
    step: e.step,
    pending: [],
    best: null,
  };
  withAt(next, task, pos);
  const p = propose(scope, e, next, opts, validate);
  next.pending = p.pending;
  next.best = p.best;
  out.next = p.best;
  out.task = next;
  return out;
}

/** The result of a step before any scoring: the proposal held so far, nothing learned yet. */
function stepStart(task: LearnTask): StepResult {
  return { duplicate: false, held: task.best, next: null, scored: [], transitions: [], task };
}

/** A task_completed: every proposal held for a next call that never came is a miss. Mutates `scope`. */
export function stepTaskCompleted(
  scope: ScopeState,
  task: LearnTask,
  e: TaskCompletedEvent,
  opts: LearnOptions = DEFAULT_LEARN,
  pos?: Position,
): StepResult {
  const out = stepStart(task);
  if (appliedBefore(task.at, pos) || task.seen.includes(e.event_id))
    return { ...out, held: null, duplicate: true };
  scope.clock++;
  if (task.best) out.heldHit = false;
  scorePending(scope, task, null, e.ts, opts, out);
  // The task's calls stay in its state (a late event may still come), their search indexes need not.
  forgetIndexes(task.calls);
  for (const { key } of contexts(task.calls, opts.maxK, task.user)) {
    const c = own(scope.ctx, key);
    if (!c) continue;
    c.n++;
    c.next[''] = (c.next[''] ?? 0) + 1;
    if (halveIfOver(c.next, c.n, opts.maxCount)) c.n /= 2;
  }
  out.task = withAt(
    {
      ...task,
      seen: [...task.seen, e.event_id].slice(-opts.seenPerTask),
      pending: [],
      best: null,
      ended: true,
    },
    task,
    pos,
  );
  return out;
}

/** Records where the applied event stood; without a position (offline) the task keeps what it had. */
function withAt(next: LearnTask, task: LearnTask, pos: Position | undefined): LearnTask {
  const at = pos ?? task.at;
  if (at) next.at = at;
  else delete next.at;
  return next;
}

/**
 * The ids a task remembers after one more: a call's, or a later message's, within the last `seenPerTask`; the
 * first message's is kept whatever the count (it was kept so before later messages were).
 */
function seenWith(seen: readonly string[], id: string, first: boolean, opts: LearnOptions): string[] {
  return first ? [...seen, id] : [...seen, id].slice(-opts.seenPerTask);
}

/**
 * The user's messages are the binding sources that are not calls: the first (the request: `user` sources, and
 * the terms and mentions that refine contexts and rules) and the latest after it (`said` sources).
 */
export function stepUserMessage(
  task: LearnTask,
  e: UserMessageEvent,
  pos?: Position,
  opts: LearnOptions = DEFAULT_LEARN,
): LearnTask {
  if (appliedBefore(task.at, pos) || task.seen.includes(e.event_id)) return task;
  const first = task.user === null;
  const seen = seenWith(task.seen, e.event_id, first, opts);
  return withAt(first ? { ...task, user: e.text, seen } : { ...task, said: e.text, seen }, task, pos);
}

/**
 * After a user message that came after the task's first calls (what the user answered when the agent asked),
 * the learned proposals for the next call are made again, now with the answer as a `said` source: the same
 * proposals wherever no rule reads it. Those made before, without the answer, are dropped unscored. A typed
 * proposal stands (the catalog decided it from the last output, which the message does not change). Null when
 * nothing is proposed again, and after the task completed.
 */
export function proposeAfterMessage(
  scope: ScopeState,
  task: LearnTask,
  who: { tenant_id: string; agent_id: string },
  opts: LearnOptions = DEFAULT_LEARN,
  validate?: ArgsValidator,
): StepResult | null {
  // An ended task has no next call: proposing one would publish a record (executable, for an active rule) that
  // replaces the last one of a task the agent finished, and hold a proposal no call would ever score.
  if (task.calls.length === 0 || task.ended || task.best?.origin === 'typed') return null;
  const p = propose(scope, who, task, opts, validate);
  const next: LearnTask = { ...task, pending: p.pending, best: p.best };
  return { duplicate: false, held: null, next: p.best, scored: [], transitions: [], task: next };
}

export interface RuleView {
  rule_id: string;
  /** The last k tools; a last entry `!failed` means "after that call failed". */
  context: string[];
  tool: string;
  state: RuleState;
  trials: number;
  hits: number;
  precision: number | null;
  bound: number;
  bindings: { path: Path; source: Source['kind'] }[];
  /** Request terms that block the rule now (a count: the terms are the user's words, never listed). */
  exceptions: number;
  created_ts: number;
  changed_ts: number;
}

/** The scope's rules for `GET /rules` and `paver savings` (binding kinds only: no learned constants). */
export function listRules(scope: ScopeState, opts: LearnOptions = DEFAULT_LEARN): RuleView[] {
  const out: RuleView[] = [];
  for (const s of Object.values(scope.slots)) {
    const r = s.rule;
    if (!r) continue;
    out.push({
      rule_id: r.id,
      context: s.ctx.split(SEP),
      tool: s.tool,
      state: r.state,
      trials: r.trials,
      hits: r.hits,
      precision: r.dn > 0 ? r.dh / r.dn : null,
      bound: confidence(r),
      bindings: r.bindings.map((b) => ({ path: b.path, source: b.source.kind })),
      exceptions: r.ex ? Object.values(r.ex).filter((x) => blocks(x, opts)).length : 0,
      created_ts: r.created,
      changed_ts: r.changed,
    });
  }
  // Ties by rule id: the order does not depend on the order the store gave the contexts in.
  const rank = (v: RuleView) => (v.state === 'active' ? 0 : 1);
  return out.sort(
    (a, b) =>
      rank(a) - rank(b) ||
      b.trials - a.trials ||
      (a.rule_id < b.rule_id ? -1 : a.rule_id > b.rule_id ? 1 : 0),
  );
}
