import { fileURLToPath } from 'node:url';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import {
  flowCandidateRecordV1,
  registeredFlowV1,
  type RegisteredFlow,
} from '../../../../../schemas/index.js';
import { scopeTag } from '../../../../../shared/redis/keys.js';
import type { PastRun } from '../../core/outcomes.js';
import type { StoredCandidate } from '../../core/promotion.js';
import { callScript, execPipeline } from '../../../../../shared/redis/replies.js';
import {
  defineScripts,
  invokeScript,
  parseScriptReply,
  readScripts,
} from '../../../../../shared/redis/scripts.js';
import { PaverError } from '../../../../../shared/errors.js';
import type { CandidatesRead, EndedSession, RunMark, RunRecord, SessionRef } from '../engine.js';
import { sessionKey as trackerKey, type OpenSession } from '../../core/sessions.js';

const SCRIPT_DIR = fileURLToPath(new URL('./lua/', import.meta.url));
const endReply = z.tuple([z.union([z.literal(0), z.literal(1), z.literal(2)])]);
const restoreReply = z.tuple([z.union([z.literal(0), z.literal(1)])]);

export const storedCandidate = z.object({
  record: flowCandidateRecordV1,
  status: z.enum(['pending', 'promoted', 'rejected', 'retracted']),
  retracted: z.boolean(),
  decided_at: z.number().nullable(),
  // Candidates stored before shadow trials existed read as never tried.
  shadow_trials: z.number().int().nonnegative().default(0),
  shadow_proposed: z.number().int().nonnegative().default(0),
  shadow_matched: z.number().int().nonnegative().default(0),
});

/**
 * Candidates (with their decision) and the registry, per scope: `<prefix>:flows:{tenant|agent}:candidates`
 * (hash dedupe_key → candidate) and `…:registry` (hash id → flow). A rejected key stays in the candidates hash
 * with status `rejected`, which is how it is never proposed again.
 */
const pastRun = z.object({ terms: z.array(z.string()), calls: z.array(z.string()) });

/** An open session as kept between processes (what the tracker holds; see core/sessions.ts). */
const openSession = z.object({
  tenant: z.string(),
  agent: z.string(),
  terms: z.array(z.string()),
  calls: z.array(z.string()),
  shadow: z
    .object({
      key: z.string(),
      tools: z.array(z.object({ tool: z.string(), body: z.number().int().positive().optional() })),
    })
    .nullable(),
  userText: z.string().optional(),
  evidence: z
    .array(
      z.object({
        tool: z.string(),
        args: z.record(z.string(), z.unknown()).optional(),
        observation: z.unknown().optional(),
      }),
    )
    .optional(),
  at: z
    .string()
    .regex(/^\d+:\d+$/)
    .optional(),
  ran: z.boolean().optional(),
  recent: z.array(z.string()).optional(),
  requests: z.array(z.string()).optional(),
});
const endedSession = z.object({
  ended: z.literal(true),
  at: openSession.shape.at,
  requests: openSession.shape.requests,
});
/** An ended session as stored: where its last event stood, and its requests' event ids (a retry opens nothing). */
const endedText = (at: string | undefined, requests: readonly string[] | undefined) =>
  JSON.stringify({ ended: true, at, ...(requests?.length ? { requests } : {}) });

/** An ended session is remembered this long at most: past a redelivery of its events, it is not needed. */
const ENDED_TTL_MS = 3_600_000;

/**
 * A session as stored: without its arguments, outputs and request text (its `input_map` evidence). A session is
 * written again after every batch that changes it, so evidence there would cost the square of its size (a
 * 30-call session of 5 KB outputs read one event per batch: 2.3 MB written); and the evidence runs themselves
 * are kept in memory only. A session taken up by another instance, or after a restart, gives its run and its
 * shadow trial, without evidence. Raw payloads stay out of Redis as well.
 */
function sessionText(s: OpenSession): string {
  const { evidence: _e, userText: _u, evidenceChars: _c, ...kept } = s;
  return JSON.stringify(kept);
}

export class RedisFlowStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    /** Called with every candidate state before Redis is written (the durable copy, the state topic). */
    private readonly beforeSave?: (tenant: string, agent: string, c: StoredCandidate[]) => Promise<void>,
  ) {
    defineScripts(
      redis,
      readScripts(SCRIPT_DIR, ['writeCandidates', 'saveSession', 'recordRun', 'restoreRuns']),
    );
  }
  private key(tenant: string, agent: string, name: string) {
    return `${this.prefix}:flows:${scopeTag(tenant, agent)}:${name}`;
  }

  async getCandidates(tenant: string, agent: string, keys: string[]): Promise<Map<string, StoredCandidate>> {
    return (await this.read(tenant, agent, keys)).candidates;
  }
  async listCandidates(tenant: string, agent: string): Promise<StoredCandidate[]> {
    const all = await this.redis.hvals(this.key(tenant, agent, 'candidates'));
    return all.map((v) => storedCandidate.parse(JSON.parse(v)));
  }
  /** The candidates as stored, with the text each was read as (what `write` compares against). */
  async read(tenant: string, agent: string, keys: string[]): Promise<CandidatesRead> {
    const candidates = new Map<string, StoredCandidate>();
    const versions = new Map<string, string | null>();
    if (!keys.length) return { candidates, versions };
    const vals = await this.redis.hmget(this.key(tenant, agent, 'candidates'), ...keys);
    keys.forEach((k, i) => {
      const v = vals[i] ?? null;
      versions.set(k, v);
      if (v) candidates.set(k, storedCandidate.parse(JSON.parse(v)));
    });
    return { candidates, versions };
  }

  /**
   * Writes candidate decisions and promoted flows of one scope in one script (both land or neither), only if
   * every written candidate still holds the text `read` found; false when one changed. The state topic gets the
   * states first: it is the copy that must not miss a decision (a state whose write then lost is superseded by
   * the retry's).
   */
  async write(
    tenant: string,
    agent: string,
    read: CandidatesRead,
    candidates: StoredCandidate[],
    flows: RegisteredFlow[],
    ends: readonly { ref: SessionRef; at: string; requests?: string[] }[] = [],
  ): Promise<boolean | 'ended'> {
    if (!candidates.length && !flows.length) return true;
    const argv: string[] = [String(candidates.length), String(flows.length)];
    for (const c of candidates) {
      const k = c.record.dedupe_key;
      const seen = read.versions.get(k);
      if (seen === undefined)
        throw new PaverError('INTERNAL', 'flows state write: a candidate written without being read first');
      argv.push(k, seen ?? '', JSON.stringify(c));
    }
    for (const f of flows) argv.push(f.id, JSON.stringify(f));
    for (const e of ends) argv.push(endedText(e.at, e.requests), String(ENDED_TTL_MS), e.at);
    await this.beforeSave?.(tenant, agent, candidates);
    const reply = await callScript(
      this.redis,
      'writeCandidates',
      [
        this.key(tenant, agent, 'candidates'),
        this.key(tenant, agent, 'registry'),
        ...ends.map((e) => this.sessionKey(e.ref)),
      ],
      argv,
    );
    const code = parseScriptReply('writeCandidates', reply, endReply)[0];
    return code === 2 ? 'ended' : code === 1;
  }
  async flows(tenant: string, agent: string, ids: string[]): Promise<RegisteredFlow[]> {
    if (!ids.length) return [];
    const vals = await this.redis.hmget(this.key(tenant, agent, 'registry'), ...ids);
    return vals.filter((v): v is string => v !== null).map((v) => registeredFlowV1.parse(JSON.parse(v)));
  }
  async listFlows(tenant: string, agent: string): Promise<RegisteredFlow[]> {
    return (await this.redis.hvals(this.key(tenant, agent, 'registry'))).map((v) =>
      registeredFlowV1.parse(JSON.parse(v)),
    );
  }

  /**
   * A rebuild's write: each candidate and flow only where Redis has none (HSETNX), so a state a live
   * instance wrote after the rebuild's copy was taken is never overwritten by the older copy.
   */
  async restore(
    tenant: string,
    agent: string,
    candidates: readonly StoredCandidate[],
    flows: readonly RegisteredFlow[],
  ): Promise<void> {
    if (!candidates.length && !flows.length) return;
    const m = this.redis.multi();
    for (const c of candidates)
      m.hsetnx(this.key(tenant, agent, 'candidates'), c.record.dedupe_key, JSON.stringify(c));
    for (const f of flows) m.hsetnx(this.key(tenant, agent, 'registry'), f.id, JSON.stringify(f));
    await execPipeline(m, 'flows state restore');
  }

  private sessionKey(r: SessionRef) {
    return this.key(r.tenant, r.agent, `session:${r.session}`);
  }

  /**
   * Open sessions, and ended ones still remembered (`…:session:<id>` of their scope), by core/sessions.ts `sessionKey`; one that does
   * not parse is left out (followed afresh).
   */
  async loadSessions(refs: readonly SessionRef[]): Promise<Map<string, OpenSession | EndedSession>> {
    const out = new Map<string, OpenSession | EndedSession>();
    if (!refs.length) return out;
    const pipe = this.redis.pipeline();
    for (const r of refs) pipe.get(this.sessionKey(r));
    const vals = await execPipeline(pipe, 'flows session read');
    refs.forEach((r, i) => {
      const v = vals[i];
      if (typeof v !== 'string') return;
      let json: unknown;
      try {
        json = JSON.parse(v);
      } catch {
        return;
      }
      const ended = endedSession.safeParse(json);
      if (ended.success)
        return void out.set(trackerKey(r.tenant, r.agent, r.session), ended.data as EndedSession);
      const open = openSession.safeParse(json);
      if (open.success) out.set(trackerKey(r.tenant, r.agent, r.session), open.data as OpenSession);
    });
    return out;
  }

  /**
   * Writes open sessions (each expiring `ttlMs` after its last event) and the ends of others (where their last
   * event stood, for an hour at most: a redelivery then neither opens nor ends them again), in one trip.
   */
  async saveSessions(
    open: readonly { ref: SessionRef; s: OpenSession }[],
    ended: readonly { ref: SessionRef; at?: string; requests?: string[] }[],
    ttlMs: number,
  ): Promise<void> {
    if (!open.length && !ended.length) return;
    const pipe = this.redis.pipeline();
    // Through a script that keeps a state further along (saved by the partition's next owner) in place.
    const save = (ref: SessionRef, text: string, at: string | undefined, ttl: number) =>
      invokeScript(pipe, 'saveSession', [this.sessionKey(ref)], [text, at ?? '', ttl]);
    for (const { ref, s } of open) save(ref, sessionText(s), s.at, ttlMs);
    for (const { ref, at, requests } of ended) {
      if (at) save(ref, endedText(at, requests), at, Math.min(ttlMs, ENDED_TTL_MS));
      else pipe.del(this.sessionKey(ref));
    }
    await execPipeline(pipe, 'flows session write');
  }

  /** The scope's past runs (outcome memory), oldest first: a capped list `…:outcomes`. */
  async loadRuns(tenant: string, agent: string): Promise<PastRun[]> {
    const raw = await this.redis.lrange(this.key(tenant, agent, 'outcomes'), 0, -1);
    const out: PastRun[] = [];
    for (const v of raw) {
      // A run that does not parse is dropped: the memory is a ranking aid, not a record to be faithful to.
      const r = pastRun.safeParse(JSON.parse(v));
      if (r.success) out.push(r.data);
    }
    return out;
  }
  /**
   * Appends a finished session's run to the outcome memory. With `mark`, only if the stored session does not
   * show it recorded already, and together with what is left of the session (`recordRun-2.lua`): see
   * `RunRecord` for the answers.
   */
  async appendRun(
    tenant: string,
    agent: string,
    run: PastRun,
    capacity: number,
    mark?: RunMark,
    ttlMs = ENDED_TTL_MS,
  ): Promise<RunRecord> {
    const k = this.key(tenant, agent, 'outcomes');
    if (!mark) {
      if (capacity <= 0) return 'recorded';
      await execPipeline(
        this.redis.multi().rpush(k, JSON.stringify(run)).ltrim(k, -capacity, -1),
        'flows outcome write',
      );
      return 'recorded';
    }
    const [state, ttl] = mark.awaiting
      ? [sessionText({ ...mark.awaiting, ran: true }), ttlMs]
      : [endedText(mark.at, mark.requests), Math.min(ttlMs, ENDED_TTL_MS)];
    const reply = await callScript(
      this.redis,
      'recordRun',
      [k, this.sessionKey(mark.ref)],
      [JSON.stringify(run), Math.max(0, capacity), state, mark.at ?? '', ttl],
    );
    const code = parseScriptReply('recordRun', reply, endReply)[0];
    return code === 1 ? 'recorded' : code === 2 ? 'recorded-before' : 'ended';
  }
  /**
   * A rebuild's write of the runs this instance holds, only where the list is gone (never doubling a live one):
   * checked and written in one script (`restoreRuns-1.lua`). As two trips, two instances rebuilding the scope at
   * once both found it gone and both pushed their copy: every run twice.
   */
  async restoreRuns(
    tenant: string,
    agent: string,
    runs: readonly PastRun[],
    capacity: number,
  ): Promise<void> {
    if (!runs.length || capacity <= 0) return;
    const reply = await callScript(
      this.redis,
      'restoreRuns',
      [this.key(tenant, agent, 'outcomes')],
      // The last `capacity` only: the script's unpack takes them all as arguments at once.
      [capacity, ...runs.slice(-capacity).map((r) => JSON.stringify(r))],
    );
    parseScriptReply('restoreRuns', reply, restoreReply);
  }
}
