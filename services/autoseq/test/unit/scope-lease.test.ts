import type { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { ScopeLeases } from '../../src/adapters/redis/scope-lease.js';

/** A connection that records each pipeline's script calls and answers 1 to each (every lease free). */
function recordingRedis() {
  const pipelines: string[][] = [];
  const redis = {
    pipeline() {
      const queued: string[] = [];
      pipelines.push(queued);
      const pipe: Record<string, unknown> = {
        redis: { scriptsSet: {} },
        exec: async () => queued.map(() => [null, 1]),
      };
      for (const name of ['leaseAcquire', 'leaseRelease', 'leaseRenew'])
        pipe[name] = () => (queued.push(name), pipe);
      return pipe;
    },
  };
  return { redis: redis as unknown as Redis, pipelines };
}

const scope = (id: string) => ({ id, tenant: 't', agent: id });

describe('scope leases: acquire', () => {
  it('gives back only what tryAll took or marked: a batch that begins with acquire releases nothing first', async () => {
    const { redis, pipelines } = recordingRedis();
    const leases = new ScopeLeases(redis, 'p', { ttlMs: 1_000 });
    await leases.acquire([scope('a'), scope('b'), scope('c')]);
    // Before, a pipeline of leaseRelease for b and c (never asked for) came first: a round trip per copy round.
    expect(pipelines.flat().filter((n) => n === 'leaseRelease')).toEqual([]);
    expect(leases.holding().map((s) => s.id)).toEqual(['a', 'b', 'c']);
  });

  it('after tryAll, gives back what it took beyond a gap and its marks after the scope it waits for', async () => {
    const { redis, pipelines } = recordingRedis();
    const leases = new ScopeLeases(redis, 'p', { ttlMs: 1_000 });
    const scopes = [scope('a'), scope('b'), scope('c'), scope('d')];
    // b and d held by other batches: a and c taken, b and d marked.
    const took = leases.tryAll(redis.pipeline(), scopes);
    expect(took([1, 0, 1, 0])).toBe(false);
    pipelines.length = 0;
    await leases.acquire(scopes);
    expect(pipelines[0]).toEqual(['leaseRelease', 'leaseRelease']);
    expect(leases.holding().map((s) => s.id)).toEqual(['a', 'b', 'c', 'd']);
  });
});
