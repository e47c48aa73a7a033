/**
 * Open sessions as the flows service follows them on the tool-calls topic: the terms of the first request,
 * the tools called since, and the pending candidate chosen for it in shadow. A session ends at its
 * `task_completed`; then its run feeds the outcome scorer and its shadow choice is scored. Bounded: past
 * `maxSessions`, or `maxIdBytes` of event ids, the oldest open session is dropped from memory (the service keeps
 * every open session in Redis too, and reads one back when its next event comes; without that, as offline, it is
 * dropped unscored).
 */
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import type { PastCall } from '../../../../shared/core/bindings.js';
import { requestTermsOf } from '../../../../shared/core/terms.js';
import type { PlanStep } from './score.js';
export interface OpenSession {
  tenant: string;
  agent: string;
  terms: string[];
  calls: string[];
  shadow: { key: string; tools: PlanStep[] } | null;
  /** The first request's text and the calls with arguments and outputs, when evidence is kept (input_map). */
  userText?: string;
  evidence?: PastCall[];
  /** JSON characters of the arguments and outputs `evidence` holds (bounded: `EVIDENCE_SESSION_CHARS`). */
  evidenceChars?: number;
  /**
   * Where the last event applied to it stands in its stream (the service: `<partition>:<offset>`), so that an
   * event delivered again after a restart is applied once.
   */
  at?: string;
  /**
   * Its run is recorded (the outcome memory) and its end awaits the write of its shadow outcome: kept so that an
   * end delivered again after a failure between the two counts the run once, and the shadow trial once.
   */
  ran?: boolean;
  /**
   * The event ids of its latest events (at most RECENT_EVENT_IDS): a producer that retries a send puts the same
   * event at a new offset, which the position (`at`) does not catch, and its call was counted twice.
   */
  recent?: string[];
  /**
   * The event ids of its user messages (at most RECENT_EVENT_IDS, the latest), kept in its end too: a producer that
   * retries a request's send after the session ended puts it at a new offset, and it opened a phantom session,
   * which then took the session's next task as its own (with the old request's terms and shadow choice).
   */
  requests?: string[];
}

/** Remembers a request's event id in `ids` (bounded, the latest kept); the list, for a new one. */
export function withRequest(ids: readonly string[] | undefined, eventId: string): string[] {
  const out = (ids ?? []).filter((id) => id !== eventId);
  out.push(eventId);
  return out.slice(-RECENT_EVENT_IDS);
}

/**
 * Bounds of a session's evidence (memory only: it is never written to Redis). Events may be a megabyte each and a
 * session a thousand calls: kept whole, 10,000 open sessions and 200 runs per scope could hold gigabytes. A call's
 * arguments, or its output, over `EVIDENCE_CALL_CHARS` JSON characters, or past `EVIDENCE_SESSION_CHARS` for the
 * session, are left out of its evidence (the call stays, so steps still line up): no argument is then learned from
 * them, and one they would have explained is `unbound`. As autoseq's learner keeps payloads up to 32 KB.
 */
export const EVIDENCE_CALL_CHARS = 32_768;
export const EVIDENCE_SESSION_CHARS = 262_144;

export const jsonChars = (v: unknown): number => (v === undefined ? 0 : (JSON.stringify(v)?.length ?? 0));

/**
 * What an open session's evidence holds, as `EvidenceBook` counts a run: its request text (up to 64 KB, kept only
 * for evidence) with its calls' arguments and outputs. Without the text, 10,000 open sessions held up to 625 Mi
 * characters of it past FLOWS_EVIDENCE_MAX_CHARS, and a session that gave its evidence up kept its text for nothing.
 */
const heldChars = (s: OpenSession): number => (s.evidenceChars ?? 0) + (s.userText?.length ?? 0);

/** Event ids a session remembers: a retried send lands close behind the first, not hundreds of events later. */
export const RECENT_EVENT_IDS = 32;

/**
 * A string's heap bytes, counted high so the bound holds for any text: two bytes a character (V8 keeps Latin-1
 * text in one), its header and the pointer to it.
 */
const stringBytes = (s: string): number => 2 * s.length + 24;

/** The estimated heap bytes of an open session's event ids (`recent` and `requests`), as `stringBytes` counts. */
const idBytesOf = (s: OpenSession): number => {
  let n = 0;
  for (const id of s.recent ?? []) n += stringBytes(id);
  for (const id of s.requests ?? []) n += stringBytes(id);
  return n;
};

/**
 * Open sessions' event ids kept in memory at most, by their estimated heap size. A session keeps up to
 * 2 × RECENT_EVENT_IDS ids of up to 256 characters (about 34 KB): bounded by count alone, 10,000 open sessions
 * could hold 340 MB of them. 64 MiB keeps all 10,000 with both lists full of UUID-sized ids (6 KB a session);
 * past it the sessions opened first leave memory as past `maxSessions` (the service reads one back from its
 * store when its next event comes).
 */
export const MAX_OPEN_ID_BYTES = 64 * 1024 * 1024;

/** Whether `eventId` was applied to `s` already; if not, remembers it (bounded). */
export function firstSight(s: OpenSession, eventId: string): boolean {
  const recent = (s.recent ??= []);
  if (recent.includes(eventId)) return false;
  recent.push(eventId);
  if (recent.length > RECENT_EVENT_IDS) recent.splice(0, recent.length - RECENT_EVENT_IDS);
  return true;
}

/**
 * Where a session is kept in memory: its scope and id, as its Redis key has them. Session ids are the agents'
 * (a run's task id, a conversation id), so two agents or tenants can use the same one: keyed by id alone, their
 * events went into one run.
 */
export const sessionKey = (tenant: string, agent: string, session: string) =>
  `${tenant}\u001f${agent}\u001f${session}`;

/** Open sessions by `sessionKey`. */
export class SessionTracker {
  private readonly open = new Map<string, OpenSession>();
  /**
   * Bound only when told (`trim`), not on every insert: where open sessions are also kept in a store, one must
   * not leave memory in the middle of a batch that is still applying its events.
   */
  deferBound = false;
  /** Characters the open sessions' evidence holds (`heldChars`), all together (what `maxEvidenceChars` bounds). */
  private evidenceTotal = 0;
  /** Each open session's event id bytes as last counted (`idBytesOf`), and their sum (what `maxIdBytes` bounds). */
  private readonly idCounts = new Map<string, number>();
  private idTotal = 0;
  /**
   * `maxEvidenceChars`: past it, the sessions opened first lose their evidence (their runs are still recorded
   * and scored, without arguments and outputs to learn `input_map` from). Per session only, 10,000 open
   * sessions of 256 KB each could hold 2.5 GB.
   * `maxIdBytes`: past it, as past `maxSessions`, the sessions opened first leave memory (see MAX_OPEN_ID_BYTES).
   */
  constructor(
    private readonly maxSessions = 10_000,
    private readonly maxCalls = 1_000,
    private readonly maxEvidenceChars = Number.POSITIVE_INFINITY,
    private readonly maxIdBytes = MAX_OPEN_ID_BYTES,
  ) {}

  /** The estimated heap bytes of the open sessions' event ids (`recent` and `requests`). */
  get idBytes(): number {
    return this.idTotal;
  }

  /** Counts `s`'s event ids again after they changed. */
  private recount(session: string, s: OpenSession): void {
    const n = idBytesOf(s);
    this.idTotal += n - (this.idCounts.get(session) ?? 0);
    this.idCounts.set(session, n);
  }

  /** Characters of evidence the open sessions hold: request texts, and arguments and outputs as JSON. */
  get evidenceChars(): number {
    return this.evidenceTotal;
  }

  private leave(session: string): OpenSession | undefined {
    const s = this.open.get(session);
    if (!s) return undefined;
    this.open.delete(session);
    this.evidenceTotal -= heldChars(s);
    this.idTotal -= this.idCounts.get(session) ?? 0;
    this.idCounts.delete(session);
    return s;
  }

  get size(): number {
    return this.open.size;
  }

  get(session: string): OpenSession | undefined {
    return this.open.get(session);
  }

  /** Puts back a session followed before (read from where the service keeps open sessions). */
  restore(session: string, s: OpenSession): void {
    this.leave(session);
    this.open.set(session, s);
    this.evidenceTotal += heldChars(s);
    this.recount(session, s);
    this.bound();
  }

  /** Forgets every open session (another instance may have followed them since: they are read again). */
  clear(): void {
    this.open.clear();
    this.evidenceTotal = 0;
    this.idCounts.clear();
    this.idTotal = 0;
  }

  private bound(): void {
    if (!this.deferBound) this.trim();
  }

  /** Drops the oldest open sessions past the bounds; the latest stays, whatever its ids (bounded per session). */
  trim(): void {
    while (this.open.size > this.maxSessions || (this.open.size > 1 && this.idTotal > this.maxIdBytes))
      this.leave(this.open.keys().next().value!);
  }

  /**
   * The first user message opens the session; later ones of the same session change nothing but its `requests`.
   * `eventId`: the message's, remembered by the session (see `recent` and `requests`).
   */
  onRequest(
    session: string,
    s: Omit<OpenSession, 'calls' | 'evidence' | 'recent'>,
    keepEvidence = false,
    eventId?: string,
  ): void {
    const cur = this.open.get(session);
    if (cur) {
      if (eventId === undefined) return;
      cur.requests = withRequest(cur.requests, eventId);
      this.recount(session, cur);
      this.bound();
      return;
    }
    const opened: OpenSession = {
      ...s,
      calls: [],
      ...(keepEvidence ? { evidence: [] } : {}),
      ...(eventId !== undefined ? { recent: [eventId], requests: withRequest(s.requests, eventId) } : {}),
    };
    this.open.set(session, opened);
    this.evidenceTotal += heldChars(opened);
    this.recount(session, opened);
    this.bound();
    if (this.evidenceTotal > this.maxEvidenceChars) this.shedEvidence();
  }

  /** A call of an open session; one whose `eventId` the session saw already (a retried send) is not counted again. */
  onCall(session: string, call: PastCall, eventId?: string): void {
    // Bounded once the call is applied: the session may be the one that leaves memory.
    if (this.applyCall(session, call, eventId)) this.bound();
  }

  /** Whether the call was applied (its id then counted). */
  private applyCall(session: string, call: PastCall, eventId?: string): boolean {
    const s = this.open.get(session);
    if (!s || s.calls.length >= this.maxCalls) return false;
    if (eventId !== undefined) {
      if (!firstSight(s, eventId)) return false;
      this.recount(session, s);
    }
    s.calls.push(call.tool);
    if (!s.evidence) return true;
    const kept: PastCall = { tool: call.tool };
    if (call.failed !== undefined) kept.failed = call.failed;
    let used = s.evidenceChars ?? 0;
    const args = jsonChars(call.args);
    if (call.args !== undefined && args <= EVIDENCE_CALL_CHARS && used + args <= EVIDENCE_SESSION_CHARS) {
      kept.args = call.args;
      used += args;
    }
    const out = jsonChars(call.observation);
    if (
      call.observation !== undefined &&
      out <= EVIDENCE_CALL_CHARS &&
      used + out <= EVIDENCE_SESSION_CHARS
    ) {
      kept.observation = call.observation;
      used += out;
    }
    this.evidenceTotal += used - (s.evidenceChars ?? 0);
    s.evidenceChars = used;
    s.evidence.push(kept);
    if (this.evidenceTotal > this.maxEvidenceChars) this.shedEvidence();
    return true;
  }

  /** Takes the evidence of the sessions opened first until the open sessions' evidence is within its bound. */
  private shedEvidence(): void {
    for (const s of this.open.values()) {
      if (this.evidenceTotal <= this.maxEvidenceChars) return;
      if (!s.evidence && s.userText === undefined) continue;
      this.evidenceTotal -= heldChars(s);
      delete s.evidence;
      delete s.evidenceChars;
      delete s.userText;
    }
  }

  /** Closes the session: what it requested and did (null when it was never opened). */
  onDone(session: string): OpenSession | null {
    return this.leave(session) ?? null;
  }
}

/**
 * The runs a stream's sessions completed, in completion order, as the service records them: a run opens at
 * its session's first user message and ends at its `task_completed` (calls before the message, and sessions
 * that never complete, make none; two tasks of one session are two runs). What the offline commands rank and
 * learn from, so that they see the runs the service sees.
 */
export function completedRuns(events: Iterable<ToolCallsEvent>, keepEvidence: boolean): OpenSession[] {
  // No open session is dropped (the service reads one dropped from memory back from its store).
  const tracker = new SessionTracker(
    Number.POSITIVE_INFINITY,
    undefined,
    undefined,
    Number.POSITIVE_INFINITY,
  );
  const done: OpenSession[] = [];
  // The request ids of ended sessions, as the service's end marks keep them: a retried request opens nothing.
  // Bounded as the engine holds them in memory (unbounded, they grew with the input): as the replay, which has
  // no store to read a dropped one back from, a request retried that long after its end opens a session.
  const ended = new EndedSessions();
  for (const e of events) {
    const k = sessionKey(e.tenant_id, e.agent_id, e.session_id);
    if (e.type === 'user_message') {
      const before = tracker.get(k) ? undefined : ended.get(k)?.requests;
      if (before?.includes(e.event_id)) continue;
      tracker.onRequest(
        k,
        {
          tenant: e.tenant_id,
          agent: e.agent_id,
          terms: requestTermsOf(e.text),
          shadow: null,
          ...(keepEvidence ? { userText: e.text } : {}),
          ...(before ? { requests: before } : {}),
        },
        keepEvidence,
        e.event_id,
      );
    } else if (e.type === 'tool_call')
      tracker.onCall(k, { tool: e.tool, args: e.args, observation: e.observation }, e.event_id);
    else {
      const s = tracker.onDone(k);
      if (s) {
        done.push(s);
        ended.remember(k, s.requests ? { requests: s.requests } : {});
      }
    }
  }
  return done;
}

/** Ended sessions kept in memory at most, by count (as the sessions known to be in no store). */
export const MAX_ENDED_SESSIONS = 10_000;
/**
 * And by their estimated heap size. An ended session keeps up to RECENT_EVENT_IDS request ids of up to 256
 * characters: by count alone, 10,000 of them held about 90 MB of heap (measured; 170 MB as two-byte text).
 * 8 MiB keeps all 10,000 of a few ids of UUID size each (under 1 KB a session); sessions with many or long ids
 * give way first, and one dropped is read back from the store (its end mark, kept there an hour) when its next
 * event comes.
 */
export const MAX_ENDED_BYTES = 8 * 1024 * 1024;

/** A remembered end's own cost: its map entry, its object and its list. */
const ENDED_ENTRY_BYTES = 160;

export interface EndMark {
  at?: string;
  requests?: string[];
}

const endBytes = (key: string, end: EndMark): number => {
  let n = ENDED_ENTRY_BYTES + stringBytes(key) + (end.at === undefined ? 0 : stringBytes(end.at));
  for (const id of end.requests ?? []) n += stringBytes(id);
  return n;
};

/**
 * Ended sessions' last positions and request ids by `sessionKey`, the latest remembered kept, within
 * `maxSessions` and `maxBytes` (estimated as `endBytes` counts them).
 */
export class EndedSessions {
  private readonly ends = new Map<string, { end: EndMark; bytes: number }>();
  private total = 0;

  constructor(
    private readonly maxSessions = MAX_ENDED_SESSIONS,
    private readonly maxBytes = MAX_ENDED_BYTES,
  ) {}

  get size(): number {
    return this.ends.size;
  }

  /** The estimated heap bytes held (what `maxBytes` bounds). */
  get bytes(): number {
    return this.total;
  }

  get(key: string): EndMark | undefined {
    return this.ends.get(key)?.end;
  }

  /** Remembers an end as the latest; returns the keys dropped to stay within the bounds, oldest first. */
  remember(key: string, end: EndMark): string[] {
    this.forget(key);
    const bytes = endBytes(key, end);
    this.ends.set(key, { end, bytes });
    this.total += bytes;
    const dropped: string[] = [];
    // The latest one stays, whatever its size: a single end is bounded by the ids' own limits (about 17 KB).
    while (this.ends.size > 1 && (this.ends.size > this.maxSessions || this.total > this.maxBytes)) {
      const oldest = this.ends.keys().next().value!;
      this.forget(oldest);
      dropped.push(oldest);
    }
    return dropped;
  }

  private forget(key: string): void {
    const had = this.ends.get(key);
    if (!had) return;
    this.ends.delete(key);
    this.total -= had.bytes;
  }

  clear(): void {
    this.ends.clear();
    this.total = 0;
  }
}
