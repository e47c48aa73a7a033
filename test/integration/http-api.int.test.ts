import { afterAll, describe, expect, it } from 'vitest';
import { createTopics, waitFor } from '../helpers/kafka.js';
import { ownRedis, stopOwnRedis } from '../helpers/own-redis.js';
import { killAll, serviceEnv, startReady, type Proc } from '../helpers/process.js';

const procs: Proc[] = [];
afterAll(async () => {
  await killAll(procs);
  stopOwnRedis();
});

/** One request with a guard far above the deadlines: a hang answers null. */
async function request(
  url: string,
): Promise<{ status: number; body: unknown; retryAfter: string | null } | null> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(20_000) });
    const text = await res.text();
    return {
      status: res.status,
      body: JSON.parse(text) as unknown,
      retryAfter: res.headers.get('retry-after'),
    };
  } catch {
    return null;
  }
}

describe('HTTP API while Redis is down (real Kafka, real Redis, real process)', () => {
  it('a route that needs Redis answers 503 with a JSON error saying so, not a 500, whether Redis is gone or frozen', async () => {
    const r = await ownRedis();
    const env = serviceEnv({ REDIS_URL: r.url, REDIS_COMMAND_TIMEOUT_MS: '1000' });
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const p = await startReady(['bin/paver.js', 'run', 'detector'], env, procs);
    const url = p.url('/candidates?tenant_id=default&agent_id=default');
    expect((await request(url))?.status).toBe(200);
    // The route names its query parameters: `tenant=` is not read as `tenant_id=` (the default tenant's answer).
    expect(await request(p.url('/candidates?tenant=acme'))).toMatchObject({
      status: 400,
      body: { error: 'unknown query parameter "tenant" (takes tenant_id, agent_id)' },
    });

    // Frozen: a command times out after REDIS_COMMAND_TIMEOUT_MS.
    r.child.kill('SIGSTOP');
    const frozen = await request(url);
    r.child.kill('SIGCONT');
    expect(frozen).toMatchObject({ status: 503, body: { error: expect.stringMatching(/Redis/) } });
    expect(frozen?.retryAfter).toBe('1');

    // Gone: the connection is refused.
    r.child.kill('SIGKILL');
    await waitFor(() => r.child.exitCode !== null || r.child.signalCode !== null, 'redis-server gone');
    const gone = await request(url);
    expect(gone).toMatchObject({ status: 503, body: { error: expect.stringMatching(/Redis/) } });
    expect(JSON.stringify(gone?.body)).not.toMatch(/ECONNREFUSED|MaxRetries|at .*\.js/);
    expect(p.child.exitCode).toBeNull();
  });
});
