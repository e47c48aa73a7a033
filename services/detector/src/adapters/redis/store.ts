import { fileURLToPath } from 'node:url';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import {
  defineScripts,
  invokeScript,
  parseScriptReply,
  readScripts,
} from '../../../../../shared/redis/scripts.js';
import { scopeTag } from '../../../../../shared/redis/keys.js';
import { classifyError, errorMessage, PaverError } from '../../../../../shared/errors.js';
import type { DetectorOp, Scope } from '../../core/ops.js';
import { scopeId } from '../../core/ops.js';
import { stateFingerprint, type DetectorParams } from '../../core/params.js';
import type { GramStat } from '../../core/select.js';
import { emptyResult, type ApplyResult, type TermRecord } from '../../core/state.js';

export const SCRIPT_DIR = fileURLToPath(new URL('./lua/', import.meta.url));
/** Script name → key count: the file each name must load (a stale build may still hold older versions). */
export const SCRIPT_KEYS = { apply: 10, snapshot: 4, claim: 3, release: 3 } as const;
export const SCRIPTS = Object.keys(SCRIPT_KEYS) as (keyof typeof SCRIPT_KEYS)[];

/** One pure key builder for the detector's keyspace: `<prefix>:det:{tenant|agent}:<name>`. */
export function detectorKeys(prefix: string, s: Scope) {
  const base = `${prefix}:det:${scopeTag(s.tenant, s.agent)}`;
  const k = (name: string) => `${base}:${name}`;
  return {
    meta: k('meta'),
    open: k('open'),
    events: k('events'),
    done: k('done'),
    window: k('window'),
    records: k('records'),
    support: k('support'),
    exact: k('exact'),
    cost: k('cost'),
    msgs: k('msgs'),
    lock: k('lock'),
    dirty: k('dirty'),
    published: k('published'),
  };
}

const CODES = {
  [-2]: {
    code: 'REDIS_STATE_CONFLICT' as const,
    message:
      'detector state under this key prefix was built with other parameters; use a new REDIS_KEY_PREFIX or delete the old keys',
  },
  [-3]: { code: 'REDIS_STATE_CONFLICT' as const, message: 'publication lock lost (TTL expired)' },
};
const applyReply = z.tuple([
  z.literal(1),
  z.number(),
  z.number(),
  z.number(),
  z.number(),
  z.number(),
  z.number(),
  z.number(),
]);
const flatReply = z.array(z.union([z.string(), z.number()]));

export interface BatchOutcome extends Omit<ApplyResult, 'changed'> {
  changed: Scope[];
}

/**
 * One place for a failed script call in a pipeline: a lost connection is retriable (classifyError knows
 * the shapes); anything else is a script failure (a bug or a state the script refuses), not retried.
 */
export function pipelineError(script: string, err: unknown): PaverError {
  const c = classifyError(err);
  if (c.retriable) return c;
  return new PaverError('REDIS_SCRIPT_FAILED', `${script}: ${errorMessage(err)}`, { cause: err });
}

/** A window record as apply-10.lua packs it: tools, costs and, when the task had a user message, its terms. */
export function unpackRecord(packed: string): TermRecord {
  const [tools = '', , terms] = packed.split('\u001e');
  return {
    tools: tools === '' ? [] : tools.split('\u001f'),
    terms: terms === undefined ? null : terms === '' ? [] : terms.split(','),
  };
}

/** The detector state in Redis: the Lua twin of core/state.ts. */
export class RedisDetectorStore {
  private readonly cfg: string;
  roundTrips = 0;
  constructor(
    private readonly redis: Redis,
    private readonly params: DetectorParams,
    private readonly prefix: string,
  ) {
    this.cfg = stateFingerprint(params);
    const files = readScripts(SCRIPT_DIR, [...SCRIPTS]).filter(
      (f) => SCRIPT_KEYS[f.name as keyof typeof SCRIPT_KEYS] === f.numberOfKeys,
    );
    if (files.length !== SCRIPTS.length)
      throw new PaverError('INTERNAL', `detector Lua scripts missing from ${SCRIPT_DIR}: rebuild`);
    defineScripts(redis, files);
  }

  /** One script call per scope, all in one pipeline: one round trip per batch. */
  async applyBatch(ops: readonly DetectorOp[]): Promise<BatchOutcome> {
    const byScope = new Map<string, { scope: Scope; argv: (string | number)[]; n: number }>();
    for (const op of ops) {
      const id = scopeId(op.scope);
      let g = byScope.get(id);
      if (!g) byScope.set(id, (g = { scope: op.scope, argv: [], n: 0 }));
      const part = op.partition ?? 0;
      if (op.kind === 'call') g.argv.push('c', op.task, op.eventId, op.ts, op.step, op.tool, op.cost, part);
      else if (op.kind === 'msg')
        g.argv.push('m', op.task, op.eventId, op.ts, 0, op.terms.join(','), 0, part);
      else g.argv.push('d', op.task, op.eventId, op.ts, 0, '', 0, part);
      g.n++;
    }
    const { changed: _c, ...zero } = emptyResult();
    const out: BatchOutcome = { ...zero, changed: [] };
    if (byScope.size === 0) return out;
    const pipe = this.redis.pipeline();
    const groups = [...byScope.values()];
    for (const g of groups) {
      const k = detectorKeys(this.prefix, g.scope);
      invokeScript(
        pipe,
        'apply',
        [k.meta, k.open, k.events, k.done, k.window, k.records, k.support, k.exact, k.cost, k.msgs],
        [this.cfg, g.n, ...g.argv],
      );
    }
    const replies = (await pipe.exec()) ?? [];
    this.roundTrips++;
    replies.forEach(([err, reply], i) => {
      if (err) throw pipelineError('apply', err);
      const [, changed, applied, ignored, completed, dup, late, limit] = parseScriptReply(
        'apply',
        reply,
        applyReply,
        CODES,
      );
      out.applied += applied;
      out.ignored += ignored;
      out.ignoredBy.duplicate += dup;
      out.ignoredBy.late += late;
      out.ignoredBy.task_limit += limit;
      out.completed += completed;
      if (changed === 1) out.changed.push(groups[i]!.scope);
    });
    return out;
  }

  /** The frequent sequences and, with request terms on, the window's records, in one atomic read. */
  async snapshot(scope: Scope): Promise<{ stats: GramStat[]; records: TermRecord[] }> {
    const k = detectorKeys(this.prefix, scope);
    const reply = parseScriptReply(
      'snapshot',
      await invokeScript(
        this.redis,
        'snapshot',
        [k.support, k.exact, k.cost, k.records],
        [this.params.minOccurrences, this.params.requestTerms ? '1' : '0'],
      ),
      flatReply,
    );
    this.roundTrips++;
    const n = Number(reply[1]);
    const stats: GramStat[] = [];
    for (let i = 0; i < n; i++) {
      const at = 2 + i * 4;
      stats.push({
        key: String(reply[at]),
        support: Number(reply[at + 1]),
        exact: Number(reply[at + 2]),
        cost: Number(reply[at + 3]),
      });
    }
    const records = reply.slice(2 + n * 4).map((packed) => unpackRecord(String(packed)));
    return { stats, records };
  }

  /** The published map when the publication lock was taken; null when another instance holds it. */
  async claim(scope: Scope, token: string, ttlMs: number): Promise<Map<string, string> | null> {
    const k = detectorKeys(this.prefix, scope);
    const reply = parseScriptReply(
      'claim',
      await invokeScript(this.redis, 'claim', [k.lock, k.dirty, k.published], [token, ttlMs]),
      flatReply,
    );
    this.roundTrips++;
    if (reply[0] !== 1) return null;
    const m = new Map<string, string>();
    for (let i = 1; i + 1 < reply.length; i += 2) m.set(String(reply[i]), String(reply[i + 1]));
    return m;
  }

  /** Records what was published; true when the scope changed meanwhile and must be published again. */
  async release(
    scope: Scope,
    token: string,
    ttlMs: number,
    upserts: [string, string][],
    deletes: string[],
  ): Promise<boolean> {
    const k = detectorKeys(this.prefix, scope);
    const argv = [token, ttlMs, upserts.length, ...upserts.flat(), ...deletes];
    const reply = parseScriptReply(
      'release',
      await invokeScript(this.redis, 'release', [k.lock, k.dirty, k.published], argv),
      z.tuple([z.literal(1), z.number()]),
      CODES,
    );
    this.roundTrips++;
    return reply[1] === 1;
  }
}
