import { describe, expect, it } from 'vitest';
import { agentOrchestrationV1, id as idSchema, toolName } from '../../../../schemas/index.js';
import type { HttpRequest, HttpResponse } from '../../../../shared/http.js';
import { rng } from '../../../../testkit/streams.js';
import {
  allowedToolsRoute,
  parseTools,
  TOOLS_REQUIRED,
  validId,
  validToolName,
} from '../../src/adapters/http.js';
import type { SessionRef } from '../../src/adapters/redis/store.js';
import { loadOrchestrationFile, type Orchestrations } from '../../src/core/orchestration.js';
import {
  applyEvent,
  newSession,
  settledPosition,
  settleForToolCall,
  view,
  viewAt,
  type SessionState,
} from '../../src/core/session.js';

const TOOLS = ['web_search', 'think', 'reflect', 'summarize', 'save', 'critique', 'debate', 'search'];
const CONFIG = {
  agents: [
    {
      tenant_id: 'default',
      agent_id: 'default',
      tools: TOOLS,
      steps: [
        {
          name: 'research',
          conditions: [{ type: 'message_regex', value: 'research' }],
          availableTools: { allowed: ['web_search', 'think', 'reflect', 'summarize', 'save'] },
          sequence: ['web_search', ['think', 'reflect'], ['summarize', 'save']],
        },
        {
          name: 'evaluate',
          conditions: [{ type: 'tool_used', value: 'critique' }],
          availableTools: { allowed: ['critique', 'debate', 'reflect', 'search'] },
          sequence: ['critique', 'debate'],
        },
        { name: 'general', isDefault: true, availableTools: { denied: ['save'] } },
      ],
    },
    {
      tenant_id: 't2',
      agent_id: 'a2',
      tools: TOOLS,
      steps: [{ name: 'only', conditions: [{ type: 'tool_used', value: 'think' }], sequence: ['save'] }],
    },
  ],
};

/**
 * The route as it was before the fast path (zod on every id and tool, a copy of the state moved where a tool call
 * would be judged): the oracle.
 */
async function oracle(
  config: Orchestrations,
  state: SessionState,
  q: URLSearchParams,
  sessionId: string,
): Promise<{ status: number; body: unknown }> {
  const ref = { tenant: q.get('tenant_id') ?? 'default', agent: q.get('agent_id') ?? 'default' };
  if (![ref.tenant, ref.agent, sessionId].every((x) => idSchema.safeParse(x).success))
    return { status: 400, body: { error: expect.stringContaining('session_id') as unknown } };
  const toolsParam = q.get('tools');
  const tools =
    toolsParam === null
      ? null
      : toolsParam
          .split(',')
          .map((t) => t.trim())
          .filter(Boolean);
  if (tools && (tools.length > 10_000 || !tools.every((t) => toolName.safeParse(t).success)))
    return { status: 400, body: { error: 'tools must be a comma-separated list of tool names' } };
  const agent = config.get(ref.tenant, ref.agent);
  if (tools === null && !agent?.tools.length)
    return { status: 400, body: { error: expect.stringContaining('tools is required') as unknown } };
  const s = { ...state };
  if (agent) settleForToolCall(agent, s);
  return { status: 200, body: { session_id: sessionId, ...view(agent, s, tools ?? agent!.tools) } };
}

const request = (session: string, query: string): HttpRequest => ({
  method: 'GET',
  path: `/sessions/${session}/allowed-tools`,
  params: { session_id: session },
  query: new URLSearchParams(query),
  body: () => Promise.resolve(undefined),
});

/** What the client receives: a body sent pre-serialized (`json`) is the same JSON. */
const sent = (r: HttpResponse): { status: number; body: unknown } => ({
  status: r.status,
  body: r.json !== undefined ? JSON.parse(r.json) : r.body,
});

const ODD = [
  '',
  ' ',
  'a\u0000b',
  'tab\there',
  '\u007f',
  'x'.repeat(256),
  'x'.repeat(257),
  'é ü',
  'a,b',
  '%41',
];

describe('allowed-tools route', () => {
  it('id and tool name checks agree with the contracts', () => {
    for (const s of [...ODD, 'web_search', 'ok-id']) {
      expect(validId(s)).toBe(idSchema.safeParse(s).success);
      expect(validToolName(s)).toBe(toolName.safeParse(s).success);
    }
    expect(parseTools(' a, ,b,,c ')).toEqual(['a', 'b', 'c']);
    expect(parseTools(Array.from({ length: 10_000 }, (_, i) => `t${i}`).join(','))).toHaveLength(10_000);
    expect(parseTools(Array.from({ length: 10_001 }, (_, i) => `t${i}`).join(','))).toBeNull();
    expect(parseTools('a,b\u0001')).toBeNull();
  });

  it("settledPosition is where a tool call's applyEvent judges it, and viewAt at it is that view", () => {
    const config = loadOrchestrationFile(CONFIG);
    const agent = config.get('default', 'default')!;
    const r = rng(3);
    for (let i = 0; i < 2000; i++) {
      // Some states are in a step no longer configured ('gone').
      const s = randomState(r);
      const judged = { ...s };
      settleForToolCall(agent, judged);
      const at = settledPosition(agent, s);
      expect(at.step).toBe(judged.step === null ? undefined : agent.byName.get(judged.step));
      expect(judged.step === null || agent.byName.has(judged.step)).toBe(true);
      if (at.step) expect(at.index).toBe(judged.index);
      expect(viewAt(at.step, at.index, TOOLS)).toEqual(view(agent, judged, TOOLS));
    }
  });

  for (const change of ['removed', 'renamed'] as const) {
    it(`after the current step is ${change}, the allowed tools are those the next tool call is judged by`, async () => {
      const research = {
        name: 'research',
        conditions: [{ type: 'message_regex', value: 'research' }],
        availableTools: { allowed: ['web_search', 'summarize'] },
        sequence: ['web_search', 'summarize'],
      };
      // A default step with a sequence: a tool the answer allows but the event path refuses shows as a violation.
      const plan = { name: 'plan', isDefault: true, sequence: ['think', 'save'] };
      const orchestration = (steps: object[]) =>
        agentOrchestrationV1.parse({ tools: TOOLS, steps, options: { violation_policy: 'warn' } });
      const config = loadOrchestrationFile({ agents: [] });
      config.set(orchestration([research, plan]));
      const agent0 = config.get('default', 'default')!;
      const base = { ts: 0, tenant_id: 'default', agent_id: 'default', session_id: 's' };
      const call = (id: string, tool: string) =>
        ({ ...base, event_id: id, type: 'tool_call', task_id: 't', step: 0, tool }) as const;
      let s = applyEvent(agent0, newSession(), {
        ...base,
        event_id: 'm',
        type: 'user_message',
        text: 'research',
      }).state;
      s = applyEvent(agent0, s, call('c', 'web_search')).state;
      expect(s).toMatchObject({ step: 'research', index: 1 });

      config.set(orchestration(change === 'removed' ? [plan] : [{ ...research, name: 'investigate' }, plan]));
      const agent = config.get('default', 'default')!;
      const route = allowedToolsRoute(config, (_ref, respond) => Promise.resolve(respond(s)));
      const answer = sent(await route.handler(request('s', ''))).body as {
        active_step: string | null;
        expected: string[];
        allowed_tools: string[];
      };
      const judged = TOOLS.map((tool) => ({ tool, record: applyEvent(agent, s, call('n', tool)).record! }));
      const allowed = judged.filter((j) => j.record.violation === null).map((j) => j.tool);
      expect(answer.allowed_tools).toEqual([...allowed].sort());
      expect(answer.allowed_tools).toEqual(['think']);
      for (const j of judged.filter((x) => x.record.violation))
        expect(j.record.violation!.expected).toEqual(answer.expected);
      expect(answer.active_step).toBe('plan');
      // The task's end, published from that state, says the same (it said no step, every tool).
      const done = applyEvent(agent, s, {
        ...base,
        event_id: 'd',
        type: 'task_completed',
        task_id: 't',
      }).record!;
      expect(done).toMatchObject({ active_step: 'plan', allowed_tools: answer.allowed_tools });
    });
  }

  it("an event's record views the agent's tools as a fresh view() of its state does (memoized views)", () => {
    const config = loadOrchestrationFile(CONFIG);
    const agent = config.get('default', 'default')!;
    const r = rng(13);
    let s = newSession();
    for (let i = 0; i < 3000; i++) {
      const base = { event_id: `e${i}`, ts: i, tenant_id: 'default', agent_id: 'default', session_id: 's' };
      const e =
        r() < 0.15
          ? { ...base, type: 'user_message' as const, text: r() < 0.5 ? 'research this' : 'hello' }
          : {
              ...base,
              type: 'tool_call' as const,
              task_id: 't',
              step: i,
              tool: TOOLS[Math.floor(r() * TOOLS.length)]!,
            };
      const out = applyEvent(agent, s, e);
      const { active_step, sequence_index, expected, allowed_tools, completed } = out.record!;
      expect({ active_step, sequence_index, expected, allowed_tools, completed }).toEqual(
        view(agent, out.state, TOOLS),
      );
      s = out.state;
    }
  });

  it('answers exactly as the route did before the fast path, repeated requests (memo) included', async () => {
    const config = loadOrchestrationFile(CONFIG);
    const states = new Map<string, SessionState>();
    const reads: SessionRef[] = [];
    const route = allowedToolsRoute(config, (ref, respond) => {
      reads.push(ref);
      return Promise.resolve(
        respond(states.get(`${ref.tenant}|${ref.agent}|${ref.session}`) ?? newSession()),
      );
    });
    const r = rng(7);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const lists = ['', 'tools=', `tools=${TOOLS.join(',')}`, 'tools=save,think', 'tools=%20think%20,,save'];
    const refs = ['', 'tenant_id=t2&agent_id=a2', 'tenant_id=nobody', 'agent_id=%00', 'tenant_id='];
    for (let i = 0; i < 3000; i++) {
      const session = pick(['s1', 's2', 's3', '', 'x'.repeat(257), 'a\u0001']);
      const query = [pick(lists), pick([...refs, ...refs, 'tools=a%01', 'tools=,'])].join('&');
      const q = new URLSearchParams(query);
      const key = `${q.get('tenant_id') ?? 'default'}|${q.get('agent_id') ?? 'default'}|${session}`;
      states.set(key, randomState(r));
      const got = sent(await route.handler(request(session, query)));
      expect(got).toEqual(await oracle(config, states.get(key)!, q, session));
    }
    // Refused requests read no state.
    expect(reads.every((ref) => validId(ref.session))).toBe(true);
  });

  it('refuses a read without tools for an agent with none declared, rather than answer that nothing is allowed', async () => {
    const config = loadOrchestrationFile({
      agents: [
        ...CONFIG.agents,
        { tenant_id: 't3', agent_id: 'bare', steps: [{ name: 'any', isDefault: true }] },
      ],
    });
    const route = allowedToolsRoute(config, (_ref, respond) => Promise.resolve(respond(newSession())));
    const ask = async (query: string) => sent(await route.handler(request('s', query)));
    // No orchestration, and an orchestration that declares no tools: nothing to filter.
    for (const who of ['tenant_id=nobody', 'tenant_id=t3&agent_id=bare']) {
      // Before: 200 with allowed_tools [], which a runtime applying it reads as every tool refused.
      expect(await ask(who)).toEqual({ status: 400, body: { error: TOOLS_REQUIRED } });
      expect(await ask(`${who}&tools=x,y`)).toMatchObject({
        status: 200,
        body: { allowed_tools: ['x', 'y'] },
      });
    }
    expect(await ask('')).toMatchObject({ status: 200, body: { active_step: 'general' } });
  });

  it('a configuration change is seen by the next read, memo or not', async () => {
    const config = loadOrchestrationFile(CONFIG);
    const route = allowedToolsRoute(config, (_ref, respond) => Promise.resolve(respond(newSession())));
    const ask = async () =>
      (
        sent(await route.handler(request('s', `tools=${TOOLS.join(',')}`))).body as {
          allowed_tools: string[];
        }
      ).allowed_tools;
    expect(await ask()).not.toContain('save');
    config.set(agentOrchestrationV1.parse({ tools: TOOLS, steps: [] }));
    expect(await ask()).toContain('save');
  });
});

function randomState(r: () => number): SessionState {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  return {
    ...newSession(),
    step: pick([null, 'research', 'evaluate', 'general', 'gone']),
    index: Math.floor(r() * 4),
    held: r() < 0.2,
    history: Array.from({ length: Math.floor(r() * 4) }, () => pick(TOOLS)),
    msg: r() < 0.5 ? ['research'] : [],
  };
}
