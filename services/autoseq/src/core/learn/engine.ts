import type { ToolCallsEvent } from '../../../../../schemas/index.js';
import {
  DEFAULT_LEARN,
  newLearnTask,
  newScopeState,
  proposeAfterMessage,
  stepTaskCompleted,
  stepToolCall,
  stepUserMessage,
  type ArgsValidator,
  type LearnOptions,
  type LearnTask,
  type Proposal,
  type ScopeState,
  type StepResult,
} from './learner.js';
import type { Position } from '../position.js';

/** One `paver predict` line: the best proposal held for this call before it was read. */
export interface PredictLine {
  event_id: string;
  task_id: string;
  proposal: null | Pick<Proposal, 'tool' | 'args' | 'origin' | 'state' | 'rule_id' | 'confidence'>;
}

export const predictProposal = (p: Proposal | null): PredictLine['proposal'] =>
  p && {
    tool: p.tool,
    args: p.args,
    origin: p.origin,
    state: p.state,
    rule_id: p.rule_id,
    confidence: p.confidence,
  };

/** The typed decider's unique decision as a proposal (its arguments are the observation it validated). */
export function typedProposal(
  records: readonly {
    event_type: string;
    tool?: string | undefined;
    arguments?: Record<string, unknown> | undefined;
  }[],
  observation: unknown,
): Proposal | null {
  const u = records.find((r) => r.event_type === 'auto_seq_detected_unique');
  if (!u?.tool) return null;
  const args =
    u.arguments ??
    (observation !== null && typeof observation === 'object' && !Array.isArray(observation)
      ? (observation as Record<string, unknown>)
      : {});
  return {
    tool: u.tool,
    args,
    origin: 'typed',
    state: 'active',
    rule_id: null,
    confidence: null,
    trials: 0,
    k: 0,
  };
}

export const scopeId = (tenant: string, agent: string) => `${tenant}\u001f${agent}`;
export const taskId = (tenant: string, agent: string, task: string) => `${tenant}\u001f${agent}\u001f${task}`;

/** Where the state lives between events: a Map offline, Redis (loaded per batch) in the service. */
export interface LearnStore {
  scope(tenant: string, agent: string): ScopeState;
  task(tenant: string, agent: string, task: string): LearnTask;
  setTask(tenant: string, agent: string, task: string, t: LearnTask): void;
}

export class MemoryLearnStore implements LearnStore {
  readonly scopes = new Map<string, ScopeState>();
  readonly tasks = new Map<string, LearnTask>();
  scope(tenant: string, agent: string): ScopeState {
    const id = scopeId(tenant, agent);
    let s = this.scopes.get(id);
    if (!s) this.scopes.set(id, (s = newScopeState()));
    return s;
  }
  task(tenant: string, agent: string, task: string): LearnTask {
    return this.tasks.get(taskId(tenant, agent, task)) ?? newLearnTask();
  }
  setTask(tenant: string, agent: string, task: string, t: LearnTask): void {
    this.tasks.set(taskId(tenant, agent, task), t);
  }
}

/**
 * Applies one input event to the learned state. A user_message without task_id is ignored (there is no task
 * to attach its text to). Returns null for events that carry no decision.
 */
export function applyEvent(
  store: LearnStore,
  e: ToolCallsEvent,
  opts: LearnOptions = DEFAULT_LEARN,
  validate?: ArgsValidator,
  typedNext: Proposal | null = null,
  pos?: Position,
): StepResult | null {
  if (e.type === 'user_message') {
    if (!e.task_id) return null;
    const t = store.task(e.tenant_id, e.agent_id, e.task_id);
    const next = stepUserMessage(t, e, pos, opts);
    if (next === t) return null;
    // A later message (the first was already read) may hold what the next call needs: propose again.
    const again =
      t.user === null
        ? null
        : proposeAfterMessage(store.scope(e.tenant_id, e.agent_id), next, e, opts, validate);
    store.setTask(e.tenant_id, e.agent_id, e.task_id, again?.task ?? next);
    return again;
  }
  const scope = store.scope(e.tenant_id, e.agent_id);
  const task = store.task(e.tenant_id, e.agent_id, e.task_id);
  const r =
    e.type === 'tool_call'
      ? stepToolCall(scope, task, e, opts, validate, pos)
      : stepTaskCompleted(scope, task, e, opts, pos);
  if (r.duplicate) return r;
  // The typed decider wins when it is unique: it becomes the proposal held for the next call.
  if (typedNext && e.type === 'tool_call') {
    r.task.best = typedNext;
    r.next = typedNext;
  }
  store.setTask(e.tenant_id, e.agent_id, e.task_id, r.task);
  return r;
}
