import type { SequenceStateRecord, ToolCallsEvent } from '../../../../schemas/index.js';
import { stepAllows, type Agent, type Step } from './orchestration.js';
import { fnv64 } from '../../../../shared/core/fnv.js';

/** Per-session state: kept small (it is stored per session in Redis), never holding message text. */
export interface SessionState {
  /** Active step name, or null. */
  step: string | null;
  index: number;
  /** `hold` policy: a violation pins the step until the expected tool is used. */
  held: boolean;
  /** Recent tools, oldest first, not de-duplicated, bounded by the agent's history length. */
  history: string[];
  /** Steps whose message_regex conditions all matched the latest user message (the text itself is not kept). */
  msg: string[];
  /**
   * Marks of the last `SEEN` event ids (`seenMark`; ids as they were in state an earlier version wrote), for events
   * published again at new offsets …
   */
  seen: string[];
  /** … and the Kafka position of the last applied event (redelivery after a crash). */
  pos: { p: number; o: string } | null;
}

/**
 * Event ids remembered per session. A whole task published again under its own ids at new offsets (ingest after a
 * crash between its publish and its store; a producer's retried batch) is a run of duplicates: each one applied
 * again pushed the next one's id out of a window of 4, so a run longer than the window was applied again whole
 * (the sequence advanced twice). 64 covers a task of 64 events; a 12-digit mark keeps that about 1 KB per session.
 */
export const SEEN = 64;
/** An event id as the session keeps it: 48 bits of its FNV hash (ids are up to 256 characters). */
export const seenMark = (eventId: string): string => fnv64(eventId).slice(0, 12);
export const newSession = (): SessionState => ({
  step: null,
  index: 0,
  held: false,
  history: [],
  msg: [],
  seen: [],
  pos: null,
});

export interface Position {
  partition: number;
  offset: string;
}

const conditionsHold = (step: Step, s: SessionState): boolean =>
  step.conditions.length > 0 &&
  (!step.hasMessageCondition || s.msg.includes(step.name)) &&
  step.conditions.every((c) => {
    if (c.type === 'message_regex') return true; // folded into s.msg above
    if (c.type === 'tool_used') return s.history.includes(c.tool);
    const n = c.groups.length;
    const from = s.history.length - n;
    return n > 0 && from >= 0 && c.groups.every((g, i) => g.includes(s.history[from + i]!));
  });

const inProgress = (step: Step | undefined, index: number) =>
  !!step && step.sequence.length > 0 && index > 0 && index < step.sequence.length;

/**
 * A `held` flag binds only what set it: the `hold` policy and a tool still expected in the step's sequence. It
 * outlives configuration changes (stored with the session), and the expected tool is what releases it: a step
 * whose sequence went away, or ends before the index, expects nothing, so the session would stay in it for good.
 */
const holds = (agent: Agent, step: Step, index: number) =>
  agent.policy === 'hold' && index < step.sequence.length;

/**
 * The active-step rule: (1) a held step stays (while it holds, see `holds`); (2) with sticky sequences, a step whose sequence is in progress
 * stays until it completes; (3) otherwise the first step, in configuration order, that has conditions and all
 * of them hold; (4) otherwise the default step; (5) otherwise none.
 */
export function selectStep(agent: Agent, s: SessionState): Step | null {
  const current = s.step === null ? undefined : agent.byName.get(s.step);
  if (current && s.held && holds(agent, current, s.index)) return current;
  if (current && agent.sticky && inProgress(current, s.index)) return current;
  return agent.steps.find((st) => conditionsHold(st, s)) ?? agent.defaultStep;
}

const completed = (step: Step | undefined, index: number) =>
  !!step && step.sequence.length > 0 && index >= step.sequence.length;

/**
 * Leaves a finished sequence (or no step) for the step the rule picks now. A completing event keeps its step so
 * that its record reports the completion; the next event, or a read of the allowed tools, settles first — as
 * AgentDock re-evaluates the active step before it processes a tool or filters the tools.
 */
export function settle(agent: Agent, s: SessionState): void {
  if (s.step === null || completed(agent.byName.get(s.step), s.index)) moveTo(s, selectStep(agent, s));
}

/**
 * Moves the session to where a tool call is judged (`applyEvent` does this before it looks at the tool). A step
 * removed or renamed by a configuration change is left first: `settle` alone would keep the name, and the
 * session would be in no step at all instead of the one the rule picks.
 */
export function settleForToolCall(agent: Agent, s: SessionState): void {
  if (s.step !== null && !agent.byName.has(s.step)) moveTo(s, null);
  fitIndex(agent, s);
  settle(agent, s);
}

/**
 * The index a session can hold in its step under the configuration in force. A change that removed the step's
 * sequence, or shortened it below the session's index, left the old index in the state, and every record and read
 * reported it (and a sequence added back later resumed from it). Clamped to the sequence's length: a step without
 * one is at 0; past the end of a shorter one, the sequence is done (AgentDock: an index outside the sequence is no
 * active sequence), reported at its length like any completed one.
 */
const indexIn = (step: Step, index: number) => Math.min(index, step.sequence.length);

function fitIndex(agent: Agent, s: SessionState): void {
  const step = s.step === null ? undefined : agent.byName.get(s.step);
  if (step && s.index > step.sequence.length) {
    s.index = indexIn(step, s.index);
    // Nothing is expected at the end of a sequence, so nothing could release a pin (see `holds`).
    s.held = false;
  }
}

function moveTo(s: SessionState, step: Step | null): void {
  const name = step?.name ?? null;
  if (name !== s.step) {
    s.step = name;
    s.index = 0;
    s.held = false;
  }
}

export interface View {
  active_step: string | null;
  sequence_index: number;
  expected: string[];
  allowed_tools: string[];
  completed: boolean;
}

const sorted = (xs: Iterable<string>) => [...new Set(xs)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));

/**
 * Allowed tools, in the reference's precedence: an active sequence allows only the expected tool(s) that the
 * step allows and that exist; when none of them exists (an inconsistent tool universe), the step's filter
 * applies instead, so the agent is not blocked — `expected` still names what the sequence wants. A finished
 * sequence, or a step without one, allows the step's allowed/denied filter (kept, unlike the reference). No
 * active step: every tool.
 */
export function view(agent: Agent | undefined, s: SessionState, universe: readonly string[]): View {
  return viewAt(s.step === null ? undefined : agent?.byName.get(s.step), s.index, universe);
}

/**
 * Where a tool call's `applyEvent` would judge it, without touching the state: the step (or none) and the index
 * in it. A step no longer configured counts as none, so the rule picks again, as `applyEvent` does before it
 * settles; treating it as no active step would allow every tool, and the next call would be judged otherwise.
 */
export function settledPosition(agent: Agent, s: SessionState): { step: Step | undefined; index: number } {
  const current = s.step === null ? undefined : agent.byName.get(s.step);
  // As fitIndex, without touching the state (the rule below picks alike: past its end a sequence holds nothing).
  const index = current ? indexIn(current, s.index) : 0;
  if (current && !completed(current, index)) return { step: current, index };
  const picked = selectStep(agent, s);
  // As moveTo: staying in the same step keeps the index, any move resets it.
  return current && picked === current ? { step: current, index } : { step: picked ?? undefined, index: 0 };
}

/**
 * `view` over the agent's own tool list (every record of an agent that declares its tools), kept per agent, step and index: it
 * is a pure function of those, computed once instead of filtering and sorting the tools on every event. A new
 * configuration is a new Agent, so nothing outlives its configuration. Views are shared: never modify one.
 */
const agentViews = new WeakMap<Agent, Map<string | null, View[]>>();
function agentView(agent: Agent, s: SessionState): View {
  const step = s.step === null ? undefined : agent.byName.get(s.step);
  // Past the sequence's end (a state this code never writes) an index is not worth a slot.
  if (step && s.index > step.sequence.length) return viewAt(step, s.index, agent.tools);
  const index = step ? s.index : 0;
  let byStep = agentViews.get(agent);
  if (!byStep) agentViews.set(agent, (byStep = new Map()));
  const name = step ? step.name : null;
  let byIndex = byStep.get(name);
  if (!byIndex) byStep.set(name, (byIndex = []));
  return (byIndex[index] ??= viewAt(step, index, agent.tools));
}

/** The view of a step (undefined: none active) at an index of its sequence. */
export function viewAt(step: Step | undefined, index: number, universe: readonly string[]): View {
  if (!step)
    return {
      active_step: null,
      sequence_index: 0,
      expected: [],
      allowed_tools: sorted(universe),
      completed: false,
    };
  const filtered = universe.filter((t) => stepAllows(step, t));
  const seq = step.sequence;
  const expected = index < seq.length ? seq[index]! : [];
  const available = expected.filter((t) => filtered.includes(t));
  return {
    active_step: step.name,
    sequence_index: index,
    expected: sorted(expected),
    allowed_tools: sorted(available.length ? available : filtered),
    completed: seq.length > 0 && index >= seq.length,
  };
}

/**
 * Why an event is left alone (neither applied nor a duplicate). `tools_unknown`: its agent has no orchestration and
 * the event lists no `visible_tools`, so there is no universe to say "all tools" of. A record would say
 * `allowed_tools: []`, which a runtime applying the records reads as nothing allowed, where the reference (no
 * orchestration) allows every tool; and the state holds nothing for it (no orchestration: no step, no history).
 */
export const IGNORE_REASONS = ['tools_unknown'] as const;
export type IgnoreReason = (typeof IGNORE_REASONS)[number];

export interface Outcome {
  record: SequenceStateRecord | null;
  state: SessionState;
  duplicate: boolean;
  /** Set when the event is left alone: no record, and `state` is the input state itself (nothing to write). */
  ignored?: IgnoreReason;
}

/** Applies one event to a session (pure: the input state is not modified). */
export function applyEvent(
  agent: Agent | undefined,
  prev: SessionState,
  e: ToolCallsEvent,
  at?: Position,
): Outcome {
  const mark = seenMark(e.event_id);
  // An id kept as it was: state an earlier version wrote (during a rolling update too).
  if (prev.seen.includes(mark) || prev.seen.includes(e.event_id))
    return { record: null, state: prev, duplicate: true };
  if (at && prev.pos && prev.pos.p === at.partition && BigInt(at.offset) <= BigInt(prev.pos.o))
    return { record: null, state: prev, duplicate: true };
  // No orchestration and no list of tools: nothing to publish, and nothing to keep (without an orchestration the
  // state records no step, history or message match, only the redelivery guard of a record not published).
  if (!agent && !(e.type === 'tool_call' && e.visible_tools?.length))
    return { record: null, state: prev, duplicate: false, ignored: 'tools_unknown' };
  const s: SessionState = {
    ...prev,
    history: [...prev.history],
    msg: prev.msg,
    seen: prev.seen.length < SEEN ? [...prev.seen, mark] : [...prev.seen.slice(1 - SEEN), mark],
    pos: at ? { p: at.partition, o: at.offset } : prev.pos,
  };
  let violation: SequenceStateRecord['violation'] = null;
  // The record says what is allowed next. A tool call's visible_tools are what the agent was shown for that call:
  // behind a runtime that applies Paver's answers, the previous record's own narrowing (the one tool expected), so
  // as the universe they made the next tool unavailable and the record offered the same tool again. The agent's
  // declared `tools` are the universe (as for the allowed-tools read); the event's list stands in only where no
  // orchestration declares any.
  const universe: readonly string[] =
    e.type === 'tool_call' && e.visible_tools && !agent?.tools.length
      ? e.visible_tools
      : (agent?.tools ?? []);

  if (agent) {
    // A step removed by a configuration change is left for the one the rule picks, whatever the event (a
    // task_completed's record showed no step, every tool allowed, where the allowed-tools route and the next
    // tool call go by the rule's pick).
    if (s.step !== null && !agent.byName.has(s.step)) {
      moveTo(s, null);
      moveTo(s, selectStep(agent, s));
    }
    // A step whose sequence was removed or shortened below the index: the index it can have now, whatever the event.
    fitIndex(agent, s);
    if (e.type === 'user_message') {
      s.msg = agent.steps
        .filter(
          (st) =>
            st.hasMessageCondition &&
            st.conditions.every((c) => c.type !== 'message_regex' || c.test(e.text)),
        )
        .map((st) => st.name);
      moveTo(s, selectStep(agent, s));
    } else if (e.type === 'tool_call') {
      settleForToolCall(agent, s);
      const step = s.step === null ? undefined : agent.byName.get(s.step);
      let completing = false;
      if (step && step.sequence.length > 0 && s.index < step.sequence.length) {
        const expected = step.sequence[s.index]!;
        if (expected.includes(e.tool)) {
          s.index++;
          s.held = false;
          completing = s.index === step.sequence.length;
        } else {
          violation = { expected: sorted(expected), used: e.tool, policy: agent.policy };
          if (agent.policy === 'reset') s.index = step.sequence[0]!.includes(e.tool) ? 1 : 0;
          else if (agent.policy === 'hold') s.held = true;
        }
      }
      s.history.push(e.tool);
      if (s.history.length > agent.history) s.history.splice(0, s.history.length - agent.history);
      // The completing event's record reports the completion; the next step is picked by settle() next time.
      if (!completing) moveTo(s, selectStep(agent, s));
    }
  }

  // A task_completed changes no state, and its record answers as the allowed-tools read does, for where the
  // next event will be judged: the step the rule picks once a sequence completed, the default step in a session
  // that starts with it. The state as it was would report a finished step completed a second time, and no step
  // (every tool allowed) in a new session with a default step.
  const settled = agent && e.type === 'task_completed' ? settledPosition(agent, s) : null;
  const v = settled
    ? viewAt(settled.step, settled.index, universe)
    : agent && universe === agent.tools
      ? agentView(agent, s)
      : view(agent, s, universe);
  return {
    record: {
      schema_version: 1,
      tenant_id: e.tenant_id,
      agent_id: e.agent_id,
      session_id: e.session_id,
      event_id: e.event_id,
      ts: e.ts,
      ...v,
      violation,
    },
    state: s,
    duplicate: false,
  };
}
