import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { replay, replayCommand } from '../../../../cli/flows-replay.js';
import { PaverError } from '../../../../shared/errors.js';
import { selectCommand } from '../../src/cli.js';
import { readPolicyFile } from '../../src/config.js';

afterEach(() => {
  vi.restoreAllMocks();
  vi.unstubAllEnvs();
});

const dir = mkdtempSync(join(tmpdir(), 'paver-policy-file-'));
const write = (name: string, text: string) => {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
};
const flows = write(
  'flows.json',
  JSON.stringify([
    {
      name: 'refund_order',
      description: 'Refund an order.',
      condition: 'The user asks for a refund of an order.',
      steps: [
        { name: 'Lookup', skill_key: 'order_lookup' },
        { name: 'Refund', skill_key: 'payments_refund' },
      ],
    },
  ]),
);
// No flow scores that high: the agent it names is given no flow, as the service would give it none.
const policy = write(
  'policy.json',
  JSON.stringify({ agents: [{ tenant_id: 'default', agent_id: 'default', score_floor: 1000 }] }),
);
let ts = 1_760_000_000_000;
const ev = (type: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    tenant_id: 'default',
    agent_id: 'default',
    session_id: 's1',
    task_id: 's1',
    type,
    event_id: `e${ts}`,
    ts: ts++,
    ...extra,
  });
const events = write(
  'events.jsonl',
  [
    ev('user_message', { text: 'refund my order please' }),
    ev('tool_call', { step: 0, tool: 'order_lookup' }),
    ev('tool_call', { step: 1, tool: 'payments_refund' }),
    ev('task_completed'),
  ].join('\n') + '\n',
);

function stdout() {
  const out = { text: '' };
  vi.spyOn(process.stdout, 'write').mockImplementation((chunk) => {
    out.text += String(chunk);
    return true;
  });
  vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
  return out;
}

describe('FLOWS_POLICY_FILE offline, as the service reads it', () => {
  it('paver select takes the agent’s overrides', async () => {
    vi.stubEnv('FLOWS_CHAT_URL', undefined);
    vi.stubEnv('FLOWS_EMBEDDINGS_URL', undefined);
    const out = stdout();
    expect(await selectCommand(['--flows', flows, '--query', 'refund my order please'])).toBe(0);
    expect((JSON.parse(out.text) as { chosen: unknown[] }).chosen).toHaveLength(1);
    out.text = '';
    vi.stubEnv('FLOWS_POLICY_FILE', policy);
    expect(await selectCommand(['--flows', flows, '--query', 'refund my order please'])).toBe(0);
    expect((JSON.parse(out.text) as { chosen: unknown[] }).chosen).toEqual([]);
  });

  it('paver flows replay takes the agent’s overrides', async () => {
    const base = { input: events, flows, promotion: { mode: 'manual' as const } };
    expect((await replay({ ...base, env: {} })).chosen).toBe(1);
    expect((await replay({ ...base, env: { FLOWS_POLICY_FILE: policy } })).chosen).toBe(0);
    vi.stubEnv('FLOWS_POLICY_FILE', policy);
    const out = stdout();
    expect(await replayCommand(['--input', events, '--flows', flows, '--json'])).toBe(0);
    expect((JSON.parse(out.text) as { chosen: number }).chosen).toBe(0);
  });

  it('a policy file that is not one stops both commands (exit 2), as it stops the service', async () => {
    vi.stubEnv('FLOWS_POLICY_FILE', write('bad-policy.json', JSON.stringify({ agents: [{ top_k: 0 }] })));
    stdout();
    expect(await selectCommand(['--flows', flows, '--query', 'refund my order please'])).toBe(2);
    expect(await replayCommand(['--input', events, '--flows', flows, '--json'])).toBe(2);
  });

  it('a bad or unreadable policy file is CONFIG_INVALID offline too, as for the service', async () => {
    const bad = write('bad-policy-2.json', JSON.stringify({ agents: [{ top_k: 0 }] }));
    const missing = join(dir, 'no-such-policy.json');
    const base = { input: events, flows, promotion: { mode: 'manual' as const } };
    for (const [path, message] of [
      [bad, `FLOWS_POLICY_FILE ${bad}: `],
      [missing, `FLOWS_POLICY_FILE: cannot read ${missing}: `],
    ] as const) {
      for (const read of [
        () => readPolicyFile({ FLOWS_POLICY_FILE: path }),
        () => replay({ ...base, env: { FLOWS_POLICY_FILE: path } }),
      ]) {
        const err: unknown = await read().then(
          () => null,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(PaverError);
        expect(err).toMatchObject({ code: 'CONFIG_INVALID', retriable: false });
        expect((err as Error).message.startsWith(message)).toBe(true);
      }
    }
  });
});
