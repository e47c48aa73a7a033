import { LIMITS } from '../../../../schemas/limits.js';
import type { Route } from '../../../../shared/http.js';
import type { Agent, Orchestrations } from '../core/orchestration.js';
import { settledPosition, viewAt, type SessionState, type View } from '../core/session.js';
import type { SessionRef } from './redis/store.js';

const BAD_ID = 'session_id, tenant_id and agent_id must be 1-256 characters without control characters';
const BAD_TOOLS = 'tools must be a comma-separated list of tool names';
const MAX_TOOLS = 10_000;

// The contracts' `id` and `toolName` (schemas/tool-calls.v1.ts) without zod's result objects on every read:
// 1 to 256 UTF-16 units, no control character. A unit test holds them to the schemas.
// eslint-disable-next-line no-control-regex -- rejecting control characters is the point
const CONTROL = /[\u0000-\u001f\u007f]/;
export const validId = (s: string): boolean =>
  s.length >= 1 && s.length <= LIMITS.idLength && !CONTROL.test(s);
export const validToolName = (s: string): boolean =>
  s.length >= 1 && s.length <= LIMITS.toolNameLength && !CONTROL.test(s);

/** `a, b,,c` → `[a, b, c]`; null when the list is too long or a name is invalid. */
export function parseTools(param: string): string[] | null {
  const tools: string[] = [];
  for (const part of param.split(',')) {
    const t = part.trim();
    if (!t) continue;
    if (tools.length === MAX_TOOLS || !validToolName(t)) return null;
    tools.push(t);
  }
  return tools;
}

/**
 * Views already computed: a view is a pure function of the agent (a configuration change makes a new Agent, so no
 * entry outlives its configuration), the `tools` parameter, the step and the index, and a runtime asks with the
 * same few tool lists over and over. A hit skips parsing the list, computing the view and serializing it (a view is
 * kept as its serialized body tail, `bodyTail`). Bounded: lists longer than MEMO_MAX_PARAM characters are not kept, and the whole memo is
 * dropped once it holds MEMO_MAX_VIEWS views (at most a few MB whatever the requests).
 */
const MEMO_MAX_PARAM = 1024;
const MEMO_MAX_VIEWS = 4096;
const NO_TOOLS = '\u0000absent';
const NO_STEP = '\u0000none';
const NO_AGENT = {};

class ViewMemo {
  private byAgent = new WeakMap<object, Map<string, Map<string, string[]>>>();
  private views = 0;

  /** The views (serialized) of one (agent, tools) pair, by step then index; undefined when not kept (or not yet). */
  lists(agent: Agent | undefined, toolsParam: string | null): Map<string, string[]> | undefined {
    return this.byAgent.get(agent ?? NO_AGENT)?.get(toolsParam ?? NO_TOOLS);
  }

  keep(
    agent: Agent | undefined,
    toolsParam: string | null,
    stepKey: string,
    index: number,
    tail: string,
  ): void {
    if (toolsParam !== null && toolsParam.length > MEMO_MAX_PARAM) return;
    if (++this.views > MEMO_MAX_VIEWS) {
      this.byAgent = new WeakMap();
      this.views = 1;
    }
    const a = agent ?? NO_AGENT;
    let byTools = this.byAgent.get(a);
    if (!byTools) this.byAgent.set(a, (byTools = new Map()));
    let byStep = byTools.get(toolsParam ?? NO_TOOLS);
    if (!byStep) byTools.set(toolsParam ?? NO_TOOLS, (byStep = new Map()));
    let byIndex = byStep.get(stepKey);
    if (!byIndex) byStep.set(stepKey, (byIndex = []));
    byIndex[index] = tail;
  }
}

/**
 * Answers from a session's state: `respond` runs on the state this instance cached while the Redis-loss check is
 * still in flight, and again on the state read from Redis when the cached one may not answer (not cached, or
 * Redis lost the states meanwhile). Only the last answer is sent.
 */
export type AnswerFromState = <R>(ref: SessionRef, respond: (state: SessionState) => R) => Promise<R>;

/** The response body without its opening `{`: the view's part of `{"session_id": …, …view}`, serialized once. */
const bodyTail = (v: View): string => JSON.stringify(v).slice(1);
const bodyJson = (session: string, tail: string): string =>
  `{"session_id":${JSON.stringify(session)}${tail === '}' ? '' : ','}${tail}`;

/**
 * Without `tools` the agent's declared tools are the universe; an agent that declares none (or has no orchestration)
 * has none to filter, and `allowed_tools: []` would read as "nothing allowed" to a runtime that applies it, where
 * the reference allows every tool. Refused, naming the fix, rather than answered.
 */
export const TOOLS_REQUIRED =
  'tools is required for this agent: its configuration declares no tools (or it has no orchestration), so there is nothing to filter; pass the tools available to it as tools=a,b';

export const NOT_LOADED =
  'the orchestration topic is not read to its end yet: the answer could ignore the configuration in force, retry later';

/**
 * `GET /sessions/:session_id/allowed-tools?tools=a,b[&tenant_id&agent_id]`: the allowed tools now. `loaded`: false
 * while the orchestration topic is still being read (start-up), when the route answers 503 rather than with the
 * configuration read so far, as consumption waits for it: an agent not read yet would be answered with no step
 * and every tool, one whose record is still ahead with its configuration file's (or an older record's) steps.
 */
export function allowedToolsRoute(
  config: Orchestrations,
  answer: AnswerFromState,
  loaded: () => boolean = () => true,
): Route {
  const memo = new ViewMemo();
  return {
    method: 'GET',
    path: '/sessions/:session_id/allowed-tools',
    query: ['tools', 'tenant_id', 'agent_id'],
    async handler(req) {
      const ref = {
        tenant: req.query.get('tenant_id') ?? 'default',
        agent: req.query.get('agent_id') ?? 'default',
        session: req.params.session_id ?? '',
      };
      if (!validId(ref.tenant) || !validId(ref.agent) || !validId(ref.session))
        return { status: 400, body: { error: BAD_ID } };
      const toolsParam = req.query.get('tools');
      if (!loaded()) return { status: 503, body: { error: NOT_LOADED } };
      const agent = config.get(ref.tenant, ref.agent);
      if (toolsParam === null && !agent?.tools.length)
        return { status: 400, body: { error: TOOLS_REQUIRED } };
      // A list already in the memo was valid; any other is parsed (and refused) before the state is read.
      let tools: string[] | null = null;
      if (toolsParam !== null && !memo.lists(agent, toolsParam) && !(tools = parseTools(toolsParam)))
        return { status: 400, body: { error: BAD_TOOLS } };
      const respond = (state: SessionState) => {
        // The step the next event would be processed in: a session never seen is in the step the rule picks for
        // an empty session (the default step, if any); a finished sequence gives way to the rule's pick.
        const at = agent ? settledPosition(agent, state) : { step: undefined, index: 0 };
        const stepKey = at.step?.name ?? NO_STEP;
        const index = at.step ? at.index : 0;
        // Past the sequence's end (a state this code never writes) an index is not a key worth keeping.
        const keep = !at.step || index <= at.step.sequence.length;
        let tail = keep ? memo.lists(agent, toolsParam)?.get(stepKey)?.[index] : undefined;
        if (tail === undefined) {
          const universe = toolsParam === null ? agent!.tools : (tools ?? parseTools(toolsParam)!);
          tail = bodyTail(viewAt(at.step, index, universe));
          if (keep) memo.keep(agent, toolsParam, stepKey, index, tail);
        }
        return { status: 200, body: null, json: bodyJson(ref.session, tail) };
      };
      return answer(ref, respond);
    },
  };
}
