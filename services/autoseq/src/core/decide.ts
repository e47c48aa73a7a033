import type { NextActionRecord, ToolCallEvent } from '../../../../schemas/index.js';
import type { Catalog, CompiledTool, ScopeCatalog } from './catalog.js';
import { callFailed } from './learn/learner.js';
import { appliedBefore, type Position } from './position.js';
import { holdsUnsafeInteger, isMapping, payloadShape, type Hash, type PayloadShape } from './shape.js';

export interface AutoseqOptions {
  /** Auto-executed steps in a row per task before the loop guard stops execution. */
  maxConsecutive: number;
  /** Put the observation into an executable unique decision as `arguments`. */
  includeArguments: boolean;
  /** Event ids remembered per task for idempotency. */
  seenPerTask: number;
}

export const DEFAULT_OPTIONS: AutoseqOptions = { maxConsecutive: 5, includeArguments: true, seenPerTask: 64 };

/** What autoseq remembers per task between events: small, JSON-serialisable, stored in Redis by the service. */
export interface TaskState {
  /** Recent event ids of this task: a redelivered event changes nothing and emits nothing. */
  seen: string[];
  /** The tool decided unique after the previous event (to recognise its auto-executed call). */
  pending: string | null;
  /** Auto-executed (`origin: "auto_seq"`) steps in a row, ending at the latest event. */
  consecutive: number;
  /** The last executable decision in the current auto-executed run: tool and payload fingerprint. */
  last: { tool: string; fp: string } | null;
  /** Where the task's last applied event stood; absent offline (files) and in state written before it was kept. */
  at?: Position;
  /**
   * What the gates on the previous step read of the task's last call (see `PrevCall`); absent before its first
   * call, and in state written before it was kept.
   */
  prev?: PrevCall;
}

/**
 * What the gates on the previous step read of a call, kept with the task: a decision made after a later user
 * message follows the task's last call, and is gated by it as the decision made after that call was (the
 * message carries no status, `next_node`, `pending_actions` or `visible_tools` of its own).
 */
export interface PrevCall {
  tool: string;
  /**
   * Nothing runs after it without the model: it failed (`status: "error"`, or, without a status, an output the
   * learner judges failed: `callFailed`), was a parallel action (`next_node: "parallel"`) or left actions
   * queued (`pending_actions` > 0).
   */
  held?: true;
  /**
   * The call's `visible_tools`, when it carried them: those the agent's catalog held then (a tool it did not
   * hold could not run then; kept out, the stored state stays within the catalog's size).
   */
  visible?: string[];
}

/** `failed`: `callFailed(e)`, when the caller has it (it reads the whole output). */
export function prevCall(
  e: ToolCallEvent,
  scope: ScopeCatalog | undefined,
  failed = callFailed(e),
): PrevCall {
  const p: PrevCall = { tool: e.tool };
  if (e.next_node === 'parallel' || (e.pending_actions ?? 0) > 0 || failed) p.held = true;
  if (e.visible_tools) p.visible = scope ? e.visible_tools.filter((t) => scope.tools.has(t)) : [];
  return p;
}

export const newTaskState = (): TaskState => ({ seen: [], pending: null, consecutive: 0, last: null });

/**
 * The run of auto-executed calls after one more of them. An auto-executed call can only follow a decision on an
 * earlier call of its task, so one that meets a task with no remembered call means the task's state was lost
 * (a Redis loss, or its TTL ran out mid-run): how many calls ran automatically before it is unknown, and the run
 * counts as at its limit. Execution resumes after the agent's own next call, as after any full run; a fresh
 * count would let a task run `maxConsecutive` more steps unchecked.
 */
export const afterAutoCall = (task: TaskState, opts: AutoseqOptions): number =>
  task.seen.length === 0 ? opts.maxConsecutive : task.consecutive + 1;

/** A task's window of call ids after one more call: the newest `n`, which make a repeat a duplicate. */
export const rememberCall = (seen: string[], eventId: string, n: number): string[] =>
  [...seen, eventId].slice(-n);

export interface Decision {
  records: NextActionRecord[];
  task: TaskState;
  duplicate: boolean;
}

/**
 * The reference's gates, in order, for one `tool_call` event, with Paver's stricter rules: an unannotated
 * tool is not read-only, a tool whose schema requires nothing needs `auto_seq_from`, `auto_seq_from`
 * narrows any tool to those upstream tools, failed calls are skipped, and a loop guard bounds execution.
 */
export function decide(
  e: ToolCallEvent,
  catalog: Catalog,
  task: TaskState,
  opts: AutoseqOptions,
  hash: Hash,
  pos?: Position,
): Decision {
  if (appliedBefore(task.at, pos) || task.seen.includes(e.event_id))
    return { records: [], task, duplicate: true };
  const records: NextActionRecord[] = [];
  const auto = e.origin === 'auto_seq';
  if (auto && task.pending === e.tool) {
    const r = head(e, 'auto_seq_executed');
    r.tool = e.tool;
    records.push(withShape(r, payloadShape(e.args, hash)));
  }
  const scope = catalog.scope(e.tenant_id, e.agent_id);
  const next: TaskState = {
    seen: rememberCall(task.seen, e.event_id, opts.seenPerTask),
    pending: null,
    consecutive: auto ? afterAutoCall(task, opts) : 0,
    last: auto ? task.last : null,
  };
  const at = pos ?? task.at;
  if (at) next.at = at;
  // Read once: the gates on the next step (prev) and this step's skip both need it.
  const failed = callFailed(e);
  next.prev = prevCall(e, scope, failed);

  const shape = payloadShape(e.observation, hash);
  const policy = scope?.policy;
  const skip = (reason: NonNullable<NextActionRecord['reason']>, tool?: string) => {
    const r = head(e, 'auto_seq_skipped');
    r.reason = reason;
    if (tool) r.tool = tool;
    records.push(withShape(r, shape));
    return { records, task: next, duplicate: false };
  };
  if (!scope || !policy?.auto_seq_enabled) return skip('disabled');
  // A failure the producer reports (status) or, without a status, one its output tells (as the learner and the gates
  // on the previous step judge it): an error object is no input for the next step.
  if (failed) return skip('error_observation');
  const obs = e.observation;
  if (!isMapping(obs)) return skip('non_structured_observation');
  if (e.next_node === 'parallel') return skip('previous_step_parallel');
  if ((e.pending_actions ?? 0) > 0) return skip('pending_actions_present');

  // The event's visible_tools narrow the policy's, never widen them: a producer's list (the runtime's, or any
  // client's) cannot make a tool the agent's policy keeps out a candidate, nor executable.
  const visible = policy.visible_tools ? new Set(policy.visible_tools) : null;
  const shown = e.visible_tools ? new Set(e.visible_tools) : null;
  const denied = new Set(policy.denied_tools);
  const eligible = (t: CompiledTool) =>
    (!visible || visible.has(t.spec.name)) &&
    (!shown || shown.has(t.spec.name)) &&
    !denied.has(t.spec.name) &&
    (!policy.auto_seq_read_only_only || t.readOnly) &&
    (t.from ? t.from.has(e.tool) : t.required.length > 0);
  const matched = scope
    .preselect(new Set(Object.keys(obs)))
    .filter((t) => eligible(t) && t.validate(obs))
    .map((t) => t.spec)
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));

  if (matched.length === 0) {
    const r = head(e, 'auto_seq_detected_none');
    r.candidates = [];
    r.candidate_count = 0;
    records.push(withShape(r, shape));
    return { records, task: next, duplicate: false };
  }
  if (matched.length > 1) {
    const r = head(e, 'auto_seq_detected_ambiguous');
    r.candidates = matched.map((t) => t.name);
    r.candidate_count = matched.length;
    records.push(withShape(r, shape));
    return { records, task: next, duplicate: false };
  }
  const tool = matched[0]!;
  const execute = policy.auto_seq_execute && tool.auto_seq_execute && !holdsUnsafeInteger(obs);
  if (execute) {
    const repeat =
      next.last !== null && next.last.tool === tool.name && next.last.fp === shape.payload_fingerprint;
    if (repeat || next.consecutive >= opts.maxConsecutive) return skip('loop_guard', tool.name);
    next.last = { tool: tool.name, fp: shape.payload_fingerprint };
  }
  next.pending = tool.name;
  const r = uniqueRecord(e, shape, tool.name, execute);
  if (execute && opts.includeArguments) r.arguments = obs;
  records.push(r);
  return { records, task: next, duplicate: false };
}

/**
 * A next-action record made smaller when it is over the output size limit: an executable decision without the
 * copy of the previous output in `arguments` (the runtime holds that output), marked `arguments_omitted`; a
 * learned proposal, whose `args` nothing else holds, as no decision for its event (`auto_seq_detected_none`):
 * left out, the session's newest record stayed the previous call's, which a runtime would act on (executable,
 * perhaps) for this call. Null when there is nothing to leave out.
 */
export function withoutArguments(value: unknown): NextActionRecord | null {
  const r = value as NextActionRecord;
  if (r.arguments === undefined) {
    if (r.args === undefined) return null;
    const none = head(r, 'auto_seq_detected_none');
    none.candidates = [];
    none.candidate_count = 0;
    if (r.payload_type !== undefined) {
      none.payload_type = r.payload_type;
      none.payload_keys_count = r.payload_keys_count;
      none.payload_fingerprint = r.payload_fingerprint;
    }
    return none;
  }
  const { arguments: _left, ...rest } = r;
  return { ...rest, arguments_omitted: true };
}

/**
 * A record's common fields, in contract order. Records are built by plain stores in a fixed order (never
 * object spreads): one hidden-class chain per record kind, and the same key order as before on the wire.
 */
export function head(
  e: Pick<ToolCallEvent, 'tenant_id' | 'agent_id' | 'session_id' | 'task_id' | 'event_id' | 'step' | 'ts'>,
  event_type: NextActionRecord['event_type'],
): NextActionRecord {
  return {
    schema_version: 1,
    tenant_id: e.tenant_id,
    agent_id: e.agent_id,
    session_id: e.session_id,
    task_id: e.task_id,
    event_id: e.event_id,
    step: e.step,
    ts: e.ts,
    event_type,
  };
}

/** A unique decision's record (typed or learned): the one tool, whether to execute it, the payload shape. */
export function uniqueRecord(
  e: ToolCallEvent,
  shape: PayloadShape,
  tool: string,
  execute: boolean,
): NextActionRecord {
  const r = head(e, 'auto_seq_detected_unique');
  r.tool = tool;
  r.candidates = [tool];
  r.candidate_count = 1;
  r.execute = execute;
  return withShape(r, shape);
}

/** Appends the payload shape fields to `r`, in the order `payloadShape` gives them. */
export function withShape(r: NextActionRecord, shape: PayloadShape): NextActionRecord {
  r.payload_type = shape.payload_type;
  r.payload_keys_count = shape.payload_keys_count;
  r.payload_fingerprint = shape.payload_fingerprint;
  return r;
}
