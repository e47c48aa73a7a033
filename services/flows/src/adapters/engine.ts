import type {
  FlowCandidateRecord,
  FlowSelectionRecord,
  RegisteredFlow,
  ToolCallsEvent,
} from '../../../../schemas/index.js';
import type { OutcomeBook, PastRun } from '../core/outcomes.js';
import { flowTools } from '../core/outcomes.js';
import { requestTermsOf } from '../../../../shared/core/terms.js';
import {
  decide,
  inShadow,
  onCandidate,
  onShadowOutcome,
  refusePromotion,
  type Decision,
  type ManualDecision,
  type PromotionPolicy,
  type StoredCandidate,
} from '../core/promotion.js';
import { DEFAULT_EVIDENCE_MAX_CHARS, DEFAULT_EVIDENCE_RUNS, EvidenceBook } from '../core/dataflow.js';
import {
  flowFromCandidate,
  FlowRegistry,
  flowViolations,
  promotedFlowId,
  unscopedPromotedFlowId,
} from '../core/registry.js';
import { matchSteps } from '../core/score.js';
import { recall, type SelectPolicy } from '../core/select.js';
import {
  EndedSessions,
  sessionKey,
  SessionTracker,
  type EndMark,
  type OpenSession,
} from '../core/sessions.js';
import { select, type SelectorDeps } from './selector.js';
import { PaverError } from '../../../../shared/errors.js';

/** `partition`/`offset`: where the event stands in its topic (the service), so that a redelivery is applied once. */
export type Inbound =
  | { kind: 'candidate'; r: FlowCandidateRecord }
  | { kind: 'event'; e: ToolCallsEvent; partition?: number; offset?: string };

/** An open session's place: its scope, and its id. */
export interface SessionRef {
  tenant: string;
  agent: string;
  session: string;
}

/** A session's key in memory and in `SessionStore.load`'s answer (core/sessions.ts `sessionKey`). */
export const refKey = (r: SessionRef) => sessionKey(r.tenant, r.agent, r.session);

/**
 * Where open sessions outlive the process (the service: Redis). A session's events all come from one partition
 * (the topic is keyed by session), so one instance follows it at a time; another takes it up after a rebalance
 * or a restart by reading it here.
 */
export interface SessionStore {
  /**
   * Open sessions, and ended ones still remembered (`{ended, at}`: where their last event stood), by `refKey`
   * (scope and id: two scopes may use the same session id).
   */
  load(refs: readonly SessionRef[]): Promise<Map<string, OpenSession | EndedSession>>;
  save(
    open: readonly { ref: SessionRef; s: OpenSession }[],
    ended: readonly { ref: SessionRef; at?: string; requests?: string[] }[],
  ): Promise<void>;
}

/**
 * What recording a session's run leaves of the session, in the same write (so that an end delivered again counts
 * the run once): its end at `at` (the end event's position), or, while its shadow outcome is still to be written,
 * `awaiting`: the session as it stood, marked `ran` (the outcome's write then ends it, see `CandidateStore.write`).
 */
export interface RunMark {
  ref: SessionRef;
  at?: string;
  /** The session's request ids, kept in its end (`EndedSession.requests`). */
  requests?: string[];
  awaiting: OpenSession | null;
}

/**
 * What recording a run found: `recorded` (now), `recorded-before` (by another delivery of the end, whose shadow
 * outcome is still to be written: this one goes on to write it), `ended` (another delivery wrote both).
 */
export type RunRecord = 'recorded' | 'recorded-before' | 'ended';

/**
 * A session that ended: kept a while, so that a redelivery of its events does not open and end it again, nor a
 * producer's retry of one of its requests (`requests`: their event ids, see `OpenSession.requests`) open it again.
 */
export interface EndedSession {
  ended: true;
  at?: string;
  requests?: string[];
}

/** Whether an event at `partition`/`offset` was applied already, given the position `at` of the last one. */
function reached(at: string | undefined, partition: number | undefined, offset: string | undefined): boolean {
  if (at === undefined || partition === undefined || offset === undefined) return false;
  const i = at.indexOf(':');
  return at.slice(0, i) === String(partition) && BigInt(at.slice(i + 1)) >= BigInt(offset);
}

/** Sessions known to be in no store, remembered so that events of sessions never opened cost no read. */
const MAX_ABSENT = 10_000;

/** A session a batch changed: open (`s`), or ended (`s` null), with where its last event stood. */
interface Touched {
  ref: SessionRef;
  s: OpenSession | null;
  at: string | undefined;
  requests?: string[];
}

/** Candidates of one scope as read, and what a write must find unchanged (per key: its stored text, null: absent). */
export interface CandidatesRead {
  candidates: Map<string, StoredCandidate>;
  versions: ReadonlyMap<string, string | null>;
}

/**
 * Where candidates and their decisions live: Redis in the service, a map in the replay. Several writers decide
 * the same candidate (any instance's new detector record or shadow outcome, an operator's call), so a write is
 * a compare-and-set against what was read: false when a written candidate changed in between.
 */
export interface CandidateStore {
  read(tenant: string, agent: string, keys: string[]): Promise<CandidatesRead>;
  /** Promoted flows as stored with their candidates (the registry's copy in Redis), by id; missing ones left out. */
  flows(tenant: string, agent: string, ids: string[]): Promise<RegisteredFlow[]>;
  write(
    tenant: string,
    agent: string,
    read: CandidatesRead,
    candidates: StoredCandidate[],
    flows: RegisteredFlow[],
    /**
     * Sessions this write ends (a shadow outcome's): written with it or not at all. `ended` (nothing written)
     * when one of them is already ended at or past that end: another delivery of it wrote its outcome.
     */
    ends?: readonly { ref: SessionRef; at: string; requests?: string[] }[],
  ): Promise<boolean | 'ended'>;
}

/** A decision over some candidates of one scope, from their current states; pure, as it runs again on a conflict. */
type Plan<T> = (current: Map<string, StoredCandidate>, now: number) => { decisions: Decision[]; result: T };

/** Attempts at a contended candidate write before the batch fails (retriable): each one lost to a fresh write. */
const MAX_WRITE_ATTEMPTS = 16;

export interface EngineDeps {
  store: CandidateStore;
  /** Makes promoted flows known to every instance (the flows topic); the replay has nothing to tell. */
  publishFlows: (flows: RegisteredFlow[]) => Promise<void>;
  /**
   * Withdraws flows published for a promotion whose write then lost to another decision that left the candidate
   * unpromoted (a tombstone on the flows topic).
   */
  withdrawFlows?: (ids: string[]) => Promise<void>;
  /** A candidate write lost to another writer and was decided again. */
  onContention?: () => void;
  selector: SelectorDeps & { outcomes: OutcomeBook };
  promotionPolicy: (tenant: string, agent: string) => PromotionPolicy;
  selectPolicy: (tenant: string, agent: string) => SelectPolicy;
  now: () => number;
  onDecision?: (status: StoredCandidate['status']) => void;
  onSelection?: (path: FlowSelectionRecord['path']) => void;
  /** A promotion refused: the candidate's flow would break the flows.v1 contract (`why`, zod issues). */
  onUnpromotable?: (tenant: string, agent: string, key: string, why: string) => void;
  onShadow?: () => void;
  /**
   * Where the outcome memory persists (the service: a capped Redis list per scope); without it the memory is
   * this process's alone. A scope's runs are loaded the first time a batch touches the scope, before any run
   * of this process joins it, so the order (oldest first) holds.
   */
  /** Where open sessions are kept between processes; without it they live and die with this one. */
  sessions?: SessionStore;
  runs?: {
    load(tenant: string, agent: string): Promise<PastRun[]>;
    /** With `mark` (sessions kept in a store), recorded once whatever the deliveries of the session's end. */
    append(tenant: string, agent: string, run: PastRun, mark?: RunMark): Promise<RunRecord | void>;
  };
  /** Finished runs kept per scope to learn promoted flows' `input_map` from (FLOWS_EVIDENCE_RUNS; 0: off). */
  evidenceRuns?: number;
  /** JSON characters of evidence held by the kept runs, and again by the open sessions (FLOWS_EVIDENCE_MAX_CHARS). */
  evidenceMaxChars?: number;
}

/**
 * The flows service's consumer logic, shared with `paver flows replay` so that both choose alike: candidates
 * go through the promotion decision; tool-calls events are followed in order (a selection per user message,
 * the session's calls, and at `task_completed` the run joins the outcome memory and a shadow choice is scored).
 */
export class FlowsEngine {
  /** Pending candidates under shadow trial, as flows: chosen among in shadow, never shown to the agent. */
  readonly shadow = new FlowRegistry();
  readonly sessions: SessionTracker;
  private readonly loaded = new Set<string>();
  private readonly loading = new Map<string, Promise<void>>();
  /** Finished runs with arguments and outputs: promotion learns `input_map` from them (core/dataflow.ts). */
  readonly evidence: EvidenceBook;
  constructor(private readonly d: EngineDeps) {
    const maxChars = d.evidenceMaxChars ?? DEFAULT_EVIDENCE_MAX_CHARS;
    this.evidence = new EvidenceBook(d.evidenceRuns ?? DEFAULT_EVIDENCE_RUNS, maxChars);
    this.sessions = new SessionTracker(undefined, undefined, maxChars);
    // Kept in a store too: memory is bounded after each batch's save, never in the middle of its events.
    this.sessions.deferBound = !!d.sessions;
  }

  /**
   * Why promoting this candidate now would be refused (its flow, as `commit` would build it, breaks the flows.v1
   * contract), or null. Asked inside plans, so that such a candidate is decided as not promoted instead of failing
   * its batch at the sink for ever.
   */
  private unpromotable(t: string, a: string, r: FlowCandidateRecord, now: number): string | null {
    return flowViolations(flowFromCandidate(r, now, this.evidence.runs(t, a)));
  }

  /** An automatic promotion checked: kept, or refused (the candidate stays pending, `refused` says why). */
  private checked(t: string, a: string, o: Decision, now: number, refused: Map<string, string>): Decision {
    if (o.kind !== 'promote') return o;
    const why = this.unpromotable(t, a, o.next.record, now);
    if (why === null) return o;
    refused.set(o.next.record.dedupe_key, why);
    return refusePromotion(o);
  }

  private reportRefused(t: string, a: string, refused: ReadonlyMap<string, string>): void {
    for (const [key, why] of refused) this.d.onUnpromotable?.(t, a, key, why);
  }

  /**
   * The id a promotion of this candidate publishes under: the scoped id, unless the registry (the flows topic as
   * read) holds this scope's flow of the same candidate under the unscoped id versions before gave it. Then that
   * id, so the flow is replaced and not doubled; a flow another scope's promotion took that id from is not this
   * scope's any more, and this scope's gets the scoped id.
   */
  private flowIdOf(t: string, a: string, key: string): string {
    const old = unscopedPromotedFlowId(key);
    const f = this.d.selector.registry.get(t, a, old);
    return f?.source === 'promoted' && f.dedupe_key === key ? old : promotedFlowId(t, a, key);
  }

  /** Puts pending candidates under shadow trial back into the pool (start-up, from the candidates' states). */
  restoreShadow(tenant: string, agent: string, candidates: readonly StoredCandidate[]): void {
    for (const c of candidates) this.shadowState(tenant, agent, c);
  }

  /**
   * A candidate's state, as written by any instance, put into this instance's shadow pool: in it while pending
   * under shadow trial, out of it otherwise. Requests are scored by the instance reading their session's
   * partition, which is seldom the one that wrote the candidate.
   */
  shadowState(t: string, a: string, c: StoredCandidate): void {
    if (inShadow(c, this.d.promotionPolicy(t, a))) this.shadow.upsert(flowFromCandidate(c.record, 0));
    else this.shadow.remove(promotedFlowId(t, a, c.record.dedupe_key));
  }

  private async loadRuns(batch: readonly Inbound[]): Promise<void> {
    for (const v of batch) if (v.kind === 'event') await this.ensureRuns(v.e.tenant_id, v.e.agent_id);
  }

  /**
   * A scope's persisted runs, read into the outcome memory once per process, before any run of its own joins it.
   * One read per scope however many callers ask at once: batches of several partitions run concurrently
   * (KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY), and so does POST /flows/select; two reads in flight both added what
   * they read, and the memory held every persisted run twice (twice the evidence for the outcome scorer).
   */
  ensureRuns(tenant: string, agent: string): Promise<void> {
    const runs = this.d.runs;
    if (!runs) return Promise.resolve();
    const k = `${tenant}\u001f${agent}`;
    if (this.loaded.has(k)) return Promise.resolve();
    let p = this.loading.get(k);
    if (!p) {
      p = (async () => {
        for (const r of await runs.load(tenant, agent)) this.d.selector.outcomes.add(tenant, agent, r);
        this.loaded.add(k);
      })().finally(() => this.loading.delete(k));
      this.loading.set(k, p);
    }
    return p;
  }

  /**
   * Reads, decides and writes some candidates of one scope, deciding again from a fresh read whenever another
   * writer changed one of them first.
   *
   * Flows go to the topic before Redis (a crash in between re-promotes to the same id on redelivery) and again
   * once the write landed (a withdrawal racing this promotion then cannot have the last word, see reconcile).
   * A flow published by an attempt that lost, or by a commit that failed, is reconciled with the candidate's
   * final state. Candidate states go to the state topic before each attempt's write, so a lost attempt's states
   * are written again (unchanged, through the same compare-and-set) by the next: the topic's last word on a
   * candidate is always a state that landed.
   */
  private async commit<T>(
    t: string,
    a: string,
    keys: string[],
    plan: Plan<T>,
    restate: Iterable<string> = [],
    ends: readonly { ref: SessionRef; at: string; requests?: string[] }[] = [],
  ): Promise<{ result: T; promoted: RegisteredFlow[]; landed: boolean }> {
    const unsettled = new Map<string, string>();
    const sent = new Set<string>(restate);
    try {
      for (let attempt = 1; ; attempt++) {
        const read = await this.d.store.read(t, a, keys);
        const now = this.d.now();
        const { decisions, result } = plan(new Map(read.candidates), now);
        const changed = new Map<string, StoredCandidate>();
        const promoted: RegisteredFlow[] = [];
        for (const o of decisions) {
          if (o.kind === 'ignore') continue;
          changed.set(o.next.record.dedupe_key, o.next);
          // The same function `from-candidates --history` uses, over the runs this engine has seen finish.
          if (o.kind === 'promote') {
            const key = o.next.record.dedupe_key;
            promoted.push(
              flowFromCandidate(o.next.record, now, this.evidence.runs(t, a), this.flowIdOf(t, a, key)),
            );
          }
        }
        const writes = new Map(changed);
        // A key a lost attempt sent is in `keys` and, once created, never leaves Redis: it is in `read`.
        for (const k of sent)
          if (!writes.has(k) && read.candidates.has(k)) writes.set(k, read.candidates.get(k)!);
        if (promoted.length) await this.d.publishFlows(promoted);
        for (const f of promoted) unsettled.set(f.id, f.dedupe_key ?? '');
        const wrote = await this.d.store.write(t, a, read, [...writes.values()], promoted, ends);
        if (wrote === 'ended') {
          // Another delivery of the session's end wrote its outcome: this attempt lands nothing. What it sent
          // is set right as after a lost attempt (its states written again as they stand, its flows reconciled).
          for (const k of writes.keys()) sent.add(k);
          await this.commit(t, a, [...sent], () => ({ decisions: [], result: undefined }), sent);
          sent.clear();
          if (unsettled.size) await this.reconcile(t, a, unsettled);
          unsettled.clear();
          return { result, promoted: [], landed: false };
        }
        if (!wrote) {
          for (const k of writes.keys()) sent.add(k);
          this.d.onContention?.();
          if (attempt < MAX_WRITE_ATTEMPTS) continue;
          throw new PaverError('STATE_CONTENDED', `flows: candidate write lost ${attempt} times in a row`);
        }
        this.settle(t, a, [...changed.values()], promoted);
        if (promoted.length) await this.d.publishFlows(promoted);
        for (const f of promoted) unsettled.delete(f.id);
        if (unsettled.size) await this.reconcile(t, a, unsettled);
        return { result, promoted, landed: true };
      }
    } catch (err) {
      // Flows out on the topic whose write did not land (or whose reconciliation failed), and candidate states
      // sent by attempts that lost: settled by the next batch before anything else, or by the service's timer
      // (in memory: a process that dies here leaves them as they are).
      if (unsettled.size || sent.size) this.owe(t, a, unsettled, sent);
      throw err;
    }
  }

  /** Per scope: flows awaiting reconciliation (flow id → candidate key), and states to write again. */
  private readonly owed = new Map<
    string,
    { t: string; a: string; ids: Map<string, string>; states: Set<string> }
  >();
  private owe(t: string, a: string, ids: ReadonlyMap<string, string>, states: ReadonlySet<string>): void {
    const k = `${t}\u001f${a}`;
    const o = this.owed.get(k) ?? { t, a, ids: new Map<string, string>(), states: new Set<string>() };
    for (const [id, key] of ids) o.ids.set(id, key);
    for (const key of states) o.states.add(key);
    this.owed.set(k, o);
  }

  /** Whether writes that did not land left the topics to be set right (`settleOwed`). */
  get hasOwed(): boolean {
    return this.owed.size > 0;
  }

  /**
   * Sets the topics right after writes that did not land: each candidate a lost attempt sent to the state topic
   * is written again as it stands (so the topic's last word is a state that landed), and each flow published
   * for one is reconciled. Run before every batch, and by the service on a timer (a quiet topic, an operator's
   * call).
   */
  async settleOwed(): Promise<void> {
    for (const [k, o] of [...this.owed]) {
      // Taken out first: what a failure leaves is owed again, merged with what was owed meanwhile.
      this.owed.delete(k);
      try {
        if (o.states.size) {
          const keys = [...o.states];
          await this.commit(o.t, o.a, keys, () => ({ decisions: [], result: undefined }), keys);
        }
        if (o.ids.size) await this.reconcile(o.t, o.a, o.ids);
      } catch (err) {
        this.owe(o.t, o.a, o.ids, o.states);
        throw err;
      }
    }
  }

  /**
   * Makes the flows topic agree with the candidates' final states for flows published by writes that did not
   * land: a flow whose candidate is not promoted is withdrawn (a tombstone), one whose candidate another writer
   * promoted is published again as that writer stored it. A promotion can land between the read and the
   * tombstone; its promoter publishes again after its write, and this re-reads after the tombstone, so one of the
   * two publications comes after it.
   */
  private async reconcile(t: string, a: string, ids: ReadonlyMap<string, string>): Promise<number> {
    const promotedNow = async (of: string[]) => {
      const read = await this.d.store.read(t, a, [...new Set(of.map((id) => ids.get(id)!))]);
      return of.filter((id) => read.candidates.get(ids.get(id)!)?.status === 'promoted');
    };
    const all = [...ids.keys()];
    const keep = new Set(await promotedNow(all));
    const withdraw = all.filter((id) => !keep.has(id));
    let withdrawn = 0;
    if (withdraw.length && this.d.withdrawFlows) {
      await this.d.withdrawFlows(withdraw);
      const back = await promotedNow(withdraw);
      for (const id of back) keep.add(id);
      withdrawn = withdraw.length - back.length;
    }
    if (keep.size) {
      const stored = await this.d.store.flows(t, a, [...keep]);
      if (stored.length) await this.d.publishFlows(stored);
    }
    return withdrawn;
  }

  /**
   * Anti-entropy for the flows topic: of the promoted flows it holds (the registry, as read from it), those whose
   * candidate is stored and not promoted are reconciled (withdrawn unless promoted meanwhile). Such a flow is left
   * by a promotion that published and then never wrote, its process dead before it could reconcile (the owed work
   * is in memory), while the candidate was decided otherwise. Flows younger than `minAgeMs` are left alone: their
   * promotion may be on its way to Redis. A flow whose candidate is not stored at all is left too: only a Redis
   * that lost its state says that, and the service runs this only while its state is known intact.
   * Returns the flows withdrawn.
   */
  async reconcileRegistry(flows: readonly RegisteredFlow[], minAgeMs: number): Promise<number> {
    const byScope = new Map<string, { t: string; a: string; ids: Map<string, string> }>();
    const now = this.d.now();
    for (const f of flows) {
      if (f.source !== 'promoted' || !f.dedupe_key || now - f.registered_at < minAgeMs) continue;
      const k = `${f.tenant_id}\u001f${f.agent_id}`;
      const g = byScope.get(k) ?? { t: f.tenant_id, a: f.agent_id, ids: new Map<string, string>() };
      g.ids.set(f.id, f.dedupe_key);
      byScope.set(k, g);
    }
    let withdrawn = 0;
    for (const { t, a, ids } of byScope.values()) {
      const read = await this.d.store.read(t, a, [...new Set(ids.values())]);
      const orphans = new Map<string, string>();
      for (const [id, key] of ids) {
        const c = read.candidates.get(key);
        if (c && c.status !== 'promoted') orphans.set(id, key);
      }
      if (orphans.size) withdrawn += await this.reconcile(t, a, orphans);
    }
    return withdrawn;
  }

  /** In-process effects of a write that landed: the registry, the shadow pool, the decision counts. */
  private settle(t: string, a: string, changed: StoredCandidate[], promoted: RegisteredFlow[]): void {
    for (const f of promoted) this.d.selector.registry.upsert(f);
    for (const c of changed) {
      this.d.onDecision?.(c.status);
      this.shadowState(t, a, c);
    }
  }

  /** An operator's promote or reject, decided on the candidate's current state like every other write. */
  async decide(
    t: string,
    a: string,
    key: string,
    to: 'promote' | 'reject',
  ): Promise<{ outcome: ManualDecision; flow: RegisteredFlow | null }> {
    const { result, promoted } = await this.commit<ManualDecision>(t, a, [key], (current, now) => {
      const outcome = decide(current.get(key), to, now);
      if (outcome.kind === 'rejected')
        return { decisions: [{ kind: 'store', next: outcome.next }], result: outcome };
      if (outcome.kind === 'promoted') {
        const why = this.unpromotable(t, a, outcome.next.record, now);
        if (why !== null) return { decisions: [], result: { kind: 'unpromotable', error: why } };
        return { decisions: [{ kind: 'promote', next: outcome.next }], result: outcome };
      }
      return { decisions: [], result: outcome };
    });
    if (result.kind === 'unpromotable') this.reportRefused(t, a, new Map([[key, result.error]]));
    return { outcome: result, flow: promoted[0] ?? null };
  }

  /** `stop`: the consumer batch's signal; a selection waiting on the model stops with it (see `select`). */
  async handle(batch: readonly Inbound[], stop?: AbortSignal): Promise<FlowSelectionRecord[]> {
    await this.settleOwed();
    // Candidates, per scope: one read, one write.
    const byScope = new Map<string, FlowCandidateRecord[]>();
    for (const v of batch) {
      if (v.kind !== 'candidate') continue;
      const k = `${v.r.tenant_id}\u001f${v.r.agent_id}`;
      byScope.set(k, [...(byScope.get(k) ?? []), v.r]);
    }
    for (const records of byScope.values()) {
      const { tenant_id: t, agent_id: a } = records[0]!;
      const keys = [...new Set(records.map((x) => x.dedupe_key))];
      const { result: refused } = await this.commit(t, a, keys, (stored, now) => {
        const decisions: Decision[] = [];
        const refused = new Map<string, string>();
        for (const rec of records) {
          const o = this.checked(
            t,
            a,
            onCandidate(stored.get(rec.dedupe_key), rec, this.d.promotionPolicy(t, a), now),
            now,
            refused,
          );
          if (o.kind !== 'ignore') stored.set(rec.dedupe_key, o.next);
          decisions.push(o);
        }
        return { decisions, result: refused };
      });
      this.reportRefused(t, a, refused);
    }
    await this.loadRuns(batch);
    await this.loadSessions(batch);
    // Events, in order: what a session asked, then did, then whether it ended.
    const out: FlowSelectionRecord[] = [];
    const touched = new Map<string, Touched>();
    for (const v of batch) {
      if (v.kind !== 'event') continue;
      const e = v.e;
      const ref = { tenant: e.tenant_id, agent: e.agent_id, session: e.session_id };
      const k = refKey(ref);
      const pos =
        v.partition !== undefined && v.offset !== undefined ? `${v.partition}:${v.offset}` : undefined;
      // Applied before a restart (its batch's sessions were saved, its offsets not committed): a call or an end
      // is not applied twice, and a request does not open its session again. It still gets its selection (that
      // output may not have gone out).
      const seen = reached(this.sessions.get(k)?.at ?? this.ended.get(k)?.at, v.partition, v.offset);
      if (seen && e.type !== 'user_message') continue;
      // A request of a session that ended, sent again by its producer (a new offset): it gets its selection again,
      // as a redelivery does, and opens nothing. Before, it opened a phantom session that took the next task.
      const retried =
        e.type === 'user_message' &&
        !this.sessions.get(k) &&
        (this.ended.get(k)?.requests?.includes(e.event_id) ?? false);
      if (e.type === 'user_message') {
        const sel = await select(
          this.d.selector,
          e.tenant_id,
          e.agent_id,
          e.text,
          e.episode_summaries ?? [],
          this.d.selectPolicy(e.tenant_id, e.agent_id),
          stop,
        );
        this.d.onSelection?.(sel.path);
        out.push({
          schema_version: 1,
          tenant_id: e.tenant_id,
          agent_id: e.agent_id,
          session_id: e.session_id,
          event_id: e.event_id,
          ts: e.ts,
          ...sel,
        });
        const keep = this.evidence.capacity > 0;
        // A new task of the session keeps the ended one's request ids, so that they stay recognised.
        const before = this.sessions.get(k) ? undefined : this.ended.get(k)?.requests;
        if (!seen && !retried)
          this.sessions.onRequest(
            k,
            {
              tenant: e.tenant_id,
              agent: e.agent_id,
              terms: requestTermsOf(e.text),
              shadow: this.shadowChoice(e.tenant_id, e.agent_id, e.text),
              ...(keep ? { userText: e.text } : {}),
              ...(before ? { requests: before } : {}),
            },
            keep,
            e.event_id,
          );
        this.absent.delete(k);
      } else if (e.type === 'tool_call')
        this.sessions.onCall(k, { tool: e.tool, args: e.args, observation: e.observation }, e.event_id);
      else if (e.type === 'task_completed') {
        const requests = this.sessions.get(k)?.requests;
        if (await this.finish(ref, pos)) {
          touched.set(k, { ref, s: null, at: pos, ...(requests ? { requests } : {}) });
          this.remember(k, { ...(pos ? { at: pos } : {}), ...(requests ? { requests } : {}) });
        }
      }
      const now = this.sessions.get(k);
      if (now) {
        if (pos && !seen) now.at = pos;
        touched.set(k, { ref, s: now, at: now.at });
      }
    }
    await this.saveSessions(touched);
    return out;
  }

  /**
   * Ended sessions' last positions and request ids by `refKey`, bounded by count and bytes (their store copy is
   * what a restart reads).
   */
  private readonly ended = new EndedSessions();
  private remember(session: string, end: EndMark): void {
    // One dropped is read from the store again when its next event comes: not "in no store" any more (else a
    // retried request of it opened a session).
    for (const k of this.ended.remember(session, end)) this.absent.delete(k);
  }

  private readonly absent = new Set<string>();

  /** Reads back the open sessions this batch continues that this process does not hold (after a restart). */
  private async loadSessions(batch: readonly Inbound[]): Promise<void> {
    if (!this.d.sessions) return;
    const refs = new Map<string, SessionRef>();
    for (const v of batch) {
      if (v.kind !== 'event') continue;
      const ref = { tenant: v.e.tenant_id, agent: v.e.agent_id, session: v.e.session_id };
      const id = refKey(ref);
      if (this.sessions.get(id) || this.absent.has(id) || refs.has(id)) continue;
      refs.set(id, ref);
    }
    if (!refs.size) return;
    const found = await this.d.sessions.load([...refs.values()]);
    for (const id of refs.keys()) {
      const s = found.get(id);
      if (!s) this.absent.add(id);
      else if ('ended' in s) {
        if (s.at || s.requests)
          this.remember(id, {
            ...(s.at ? { at: s.at } : {}),
            ...(s.requests ? { requests: s.requests } : {}),
          });
        this.absent.add(id);
      } else this.sessions.restore(id, s);
    }
    for (const id of this.absent) {
      if (this.absent.size <= MAX_ABSENT) break;
      this.absent.delete(id);
    }
  }

  /**
   * Saves the sessions this batch changed (before its offsets are committed): open ones, and the end of others;
   * then bounds memory (a session dropped from it is read back from the store when its next event comes).
   */
  private async saveSessions(touched: ReadonlyMap<string, Touched>): Promise<void> {
    if (!this.d.sessions || !touched.size) return;
    const open: { ref: SessionRef; s: OpenSession }[] = [];
    const ended: { ref: SessionRef; at?: string; requests?: string[] }[] = [];
    for (const t of touched.values()) {
      if (t.s) open.push({ ref: t.ref, s: t.s });
      else
        ended.push({
          ref: t.ref,
          ...(t.at ? { at: t.at } : {}),
          ...(t.requests ? { requests: t.requests } : {}),
        });
    }
    await this.d.sessions.save(open, ended);
    this.sessions.trim();
  }

  /**
   * Forgets the open sessions this process holds: after a rebalance another instance may follow them, so they
   * are read again from the store when their next events come.
   */
  forgetSessions(): void {
    if (!this.d.sessions) return;
    this.sessions.clear();
    this.absent.clear();
    this.ended.clear();
  }

  /** The shadow pool's top candidate for this request (no model: shadow choices cost nothing). */
  private shadowChoice(t: string, a: string, query: string) {
    if (!this.shadow.list(t, a).length) return null;
    const c = recall(
      this.shadow,
      t,
      a,
      query,
      [],
      this.d.selectPolicy(t, a),
      null,
      this.d.selector.outcomes.scorer(t, a, query),
    )[0];
    return c?.flow.dedupe_key ? { key: c.flow.dedupe_key, tools: flowTools(c.flow) } : null;
  }

  /**
   * Ends a session: true when it was open. Its run is recorded, then its shadow choice scored; with a session
   * store, each of the two writes also records how far the end went, so an end delivered again (a batch retried
   * after a failure, or read again after a restart) does neither twice.
   */
  private async finish(ref: SessionRef, at: string | undefined): Promise<boolean> {
    const s = this.sessions.onDone(refKey(ref));
    if (!s) return false;
    const requests = s.requests;
    const shadow = s.shadow;
    if (!s.ran) {
      const run = { terms: s.terms, calls: s.calls };
      const mark = this.d.sessions
        ? { ref, ...(at ? { at } : {}), ...(requests ? { requests } : {}), awaiting: shadow ? s : null }
        : undefined;
      // The durable write first: a failure there leaves nothing added in memory to be added again.
      // Another delivery of this end (an instance expelled by a stall, or this one's earlier attempt) may have
      // recorded the run, and its shadow outcome too (`ended`): then nothing is left to do.
      const recorded = (await this.d.runs?.append(s.tenant, s.agent, run, mark)) ?? 'recorded';
      if (recorded === 'ended') return true;
      if (recorded === 'recorded') {
        this.d.selector.outcomes.add(s.tenant, s.agent, run);
        // Its size is the session's own count (the same as evidenceChars of the run): not measured again.
        if (s.evidence)
          this.evidence.add(
            s.tenant,
            s.agent,
            { userText: s.userText, calls: s.evidence },
            (s.evidenceChars ?? 0) + (s.userText?.length ?? 0),
          );
      }
    }
    if (!shadow) return true;
    const m = matchSteps(shadow.tools, s.calls);
    const ends = this.d.sessions && at ? [{ ref, at, ...(requests ? { requests } : {}) }] : [];
    const none = new Map<string, string>();
    const {
      result: { counted, refused },
      landed,
    } = await this.commit(
      s.tenant,
      s.agent,
      [shadow.key],
      (current, now) => {
        const prev = current.get(shadow.key);
        if (!prev) return { decisions: [], result: { counted: false, refused: none } };
        const refused = new Map<string, string>();
        const policy = this.d.promotionPolicy(s.tenant, s.agent);
        const o = this.checked(s.tenant, s.agent, onShadowOutcome(prev, m, policy, now), now, refused);
        return { decisions: [o], result: { counted: true, refused } };
      },
      [],
      ends,
    );
    if (counted && landed) this.d.onShadow?.();
    if (landed) this.reportRefused(s.tenant, s.agent, refused);
    return true;
  }
}
