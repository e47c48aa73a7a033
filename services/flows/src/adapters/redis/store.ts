import type { Redis } from 'ioredis';
import { z } from 'zod';
import {
  flowCandidateRecordV1,
  registeredFlowV1,
  type RegisteredFlow,
} from '../../../../../schemas/index.js';
import { scopeTag } from '../../../../../shared/redis/keys.js';
import type { StoredCandidate } from '../../core/promotion.js';
import { execPipeline } from '../../../../../shared/redis/replies.js';

const storedCandidate = z.object({
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
export class RedisFlowStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
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
}
