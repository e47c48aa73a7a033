import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { freePort } from '../../deploy/local/stack.js';
import { consumeUntil, unique } from '../helpers/kafka.js';
import { PAVER_BIN, serviceEnv, startProcess } from '../helpers/process.js';

const input = join(tmpdir(), `${unique('publish')}.jsonl`);
writeFileSync(
  input,
  [
    JSON.stringify({ type: 'tool_call', event_id: 'a', session_id: 's1', tenant_id: 'old', tool: 'x' }),
    'not json',
    JSON.stringify({ type: 'tool_call', event_id: 'b', session_id: 's2', tool: 'y' }),
    '',
  ].join('\n'),
);
const run = async (args: string[], env: Record<string, string>) => {
  const p = await startProcess([PAVER_BIN, 'publish', '--input', input, ...args], env);
  const code = await p.exited;
  return { code, out: p.output() };
};

describe('paver publish', () => {
  it('needs only KAFKA_BROKERS, and --tenant/--agent set tenant_id/agent_id on every event', async () => {
    const { REDIS_URL: _unused, ...env } = serviceEnv();
    const r = await run(['--tenant', 'acme', '--agent', 'bot-1'], env);
    expect(r.code).toBe(0);
    expect(r.out).toContain('published 3 events');
    const got = await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => all.length >= 3);
    const events = got.map((m) => m.value!.toString()).filter((v) => v.startsWith('{'));
    expect(
      events
        .map((v) => JSON.parse(v) as Record<string, string>)
        .map((e) => [e.event_id, e.tenant_id, e.agent_id])
        .sort(),
    ).toEqual([
      ['a', 'acme', 'bot-1'],
      ['b', 'acme', 'bot-1'],
    ]);
  });

  it('exits 78 with one line on bad configuration', async () => {
    const r = await run([], { PATH: process.env.PATH ?? '', LOG_LEVEL: 'loud' });
    expect(r.code).toBe(78);
    expect(r.out.trim().split('\n')).toHaveLength(1);
    expect(r.out).toContain('KAFKA_BROKERS: is required');
    expect(r.out).toContain('LOG_LEVEL');
    const bad = await run(['--tenant', 'a b'], {
      PATH: process.env.PATH ?? '',
      KAFKA_BROKERS: '127.0.0.1:1',
    });
    expect(bad.code).toBe(78);
    expect(bad.out).toContain('--tenant');
  });

  it('exits 69 with one clear line when no broker answers', async () => {
    const port = await freePort();
    const r = await run([], { PATH: process.env.PATH ?? '', KAFKA_BROKERS: `127.0.0.1:${port}` });
    expect(r.code).toBe(69);
    expect(r.out.trim().split('\n')).toHaveLength(1);
    expect(r.out).toContain(`no Kafka broker answered at 127.0.0.1:${port}`);
  });
});
