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

/** Tasks a MemoryLearnStore keeps as objects: the ones touched last. */
const LIVE_TASKS = 512;

export class MemoryLearnStore implements LearnStore {
  readonly scopes = new Map<string, ScopeState>();
  /**
   * Every task stays (a late event of an ended task may still come; offline there is no TTL to end it), but only
   * the last touched as objects, in touch order; the others as JSON text, several times smaller on the heap
   * than objects that hold past calls' outputs (a 640 MB file of large outputs ran out of Node's default heap).
   * 512: 1,000 tasks open at once costs a JSON round trip per event (about 1.3× the time), runs in file order none.
   * The service's store holds tasks as JSON in Redis too, so a task read back is what the service reads.
   */
  private readonly live = new Map<string, LearnTask>();
  private readonly packed = new Map<string, string>();
  scope(tenant: string, agent: string): ScopeState {
    const id = scopeId(tenant, agent);
    let s = this.scopes.get(id);
    if (!s) this.scopes.set(id, (s = newScopeState()));
    return s;
  }
  task(tenant: string, agent: string, task: string): LearnTask {
    const id = taskId(tenant, agent, task);
    const t = this.live.get(id);
    if (t) return t;
    const text = this.packed.get(id);
    return text === undefined ? newLearnTask() : (JSON.parse(text) as LearnTask);
  }
  setTask(tenant: string, agent: string, task: string, t: LearnTask): void {
    const id = taskId(tenant, agent, task);
    this.packed.delete(id);
    this.live.delete(id);
    this.live.set(id, t);
    if (this.live.size <= LIVE_TASKS) return;
    const [oldest, state] = this.live.entries().next().value as [string, LearnTask];
    this.live.delete(oldest);
    this.packed.set(oldest, JSON.stringify(state));
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
