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
import { execPipeline } from '../../../../../shared/redis/replies.js';

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

export class RedisFlowStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    /** Called with every candidate state before Redis is written (the durable copy, the state topic). */
    private readonly beforeSave?: (tenant: string, agent: string, c: StoredCandidate[]) => Promise<void>,
  ) {}
  private key(tenant: string, agent: string, name: string) {
    return `${this.prefix}:flows:${scopeTag(tenant, agent)}:${name}`;
  }

  async getCandidates(tenant: string, agent: string, keys: string[]): Promise<Map<string, StoredCandidate>> {
    const out = new Map<string, StoredCandidate>();
    if (!keys.length) return out;
    const vals = await this.redis.hmget(this.key(tenant, agent, 'candidates'), ...keys);
    keys.forEach((k, i) => {
      const v = vals[i];
      if (v) out.set(k, storedCandidate.parse(JSON.parse(v)));
    });
    return out;
  }
  async listCandidates(tenant: string, agent: string): Promise<StoredCandidate[]> {
    const all = await this.redis.hvals(this.key(tenant, agent, 'candidates'));
    return all.map((v) => storedCandidate.parse(JSON.parse(v)));
  }
  /** Writes candidate decisions and promoted flows of one scope in one MULTI (both land or neither). */
  async save(
    tenant: string,
    agent: string,
    candidates: StoredCandidate[],
    flows: RegisteredFlow[],
  ): Promise<void> {
    if (!candidates.length && !flows.length) return;
    await this.beforeSave?.(tenant, agent, candidates);
    const m = this.redis.multi();
    for (const c of candidates)
      m.hset(this.key(tenant, agent, 'candidates'), c.record.dedupe_key, JSON.stringify(c));
    for (const f of flows) m.hset(this.key(tenant, agent, 'registry'), f.id, JSON.stringify(f));
    // A MULTI reports each command's error in its reply, not by throwing: check every one.
    await execPipeline(m, 'flows state write');
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
  async appendRun(tenant: string, agent: string, run: PastRun, capacity: number): Promise<void> {
    if (capacity <= 0) return;
    const k = this.key(tenant, agent, 'outcomes');
    await execPipeline(
      this.redis.multi().rpush(k, JSON.stringify(run)).ltrim(k, -capacity, -1),
      'flows outcome write',
    );
  }
  /** A rebuild's write of the runs this instance holds, only where the list is gone (never doubling a live one). */
  async restoreRuns(
    tenant: string,
    agent: string,
    runs: readonly PastRun[],
    capacity: number,
  ): Promise<void> {
    if (!runs.length || capacity <= 0) return;
    const k = this.key(tenant, agent, 'outcomes');
    if ((await this.redis.exists(k)) > 0) return;
    await execPipeline(
      this.redis
        .multi()
        .rpush(k, ...runs.map((r) => JSON.stringify(r)))
        .ltrim(k, -capacity, -1),
      'flows outcome restore',
    );
  }
}
