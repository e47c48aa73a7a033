import type { NextActionRecord, ToolCallEvent, UserMessageEvent } from '../../../../../schemas/index.js';
import type { Catalog } from '../catalog.js';
import { head, uniqueRecord, type AutoseqOptions, type PrevCall, type TaskState } from '../decide.js';
import { holdsUnsafeInteger, payloadShape, type Hash, type PayloadShape } from '../shape.js';
import type { Proposal } from './learner.js';

/**
 * Being active means "proven"; being executable means "allowed". A learned proposal is executable only when
 * its rule is active AND the catalog lets the tool run automatically (policy `auto_seq_execute`, tool `auto_seq`
 * and `auto_seq_execute`, an explicit read-only side effect, visible, not denied, after one of its `auto_seq_from`
 * tools when it names some) AND the loop guard and max-consecutive limit pass, and the previous step (`after`)
 * neither failed nor was a parallel action nor one with actions queued.
 * Without a catalog nothing is executable (an unknown tool is not read-only).
 */
export function learnedExecutable(
  who: Pick<ToolCallEvent, 'tenant_id' | 'agent_id'>,
  /**
   * The call the decision follows: the task's last, the same after a later user message as after the call
   * (`TaskState.prev`, which `decide` keeps). Unknown (state written before it was kept, or lost): nothing runs.
   */
  after: PrevCall | undefined,
  p: Proposal,
  catalog: Catalog,
  task: TaskState,
  opts: AutoseqOptions,
  hash: Hash,
  /**
   * The decision replaces the one published for the same step (after a later user message): when that one ran
   * this tool on a payload of this shape (`pending`, `last`), the new one is that decision again, not a second
   * run of the tool, and the loop guard judges it as it judged that one.
   */
  again = false,
): { execute: boolean; task: TaskState } {
  if (p.state !== 'active') return { execute: false, task };
  // The reference's gates on the previous step hold for any decider (the typed decider skips these steps; the
  // learned proposal that replaces its record was executable): after a call that failed (error_observation: the
  // agent is likely to retry or change course, and a step run on the failed call's output would act on an
  // error), after a parallel action, or with actions already queued, nothing runs without the model. After a
  // later user message too: the gates read the task's last call, not the message (which has none of these).
  if (!after || after.held) return { execute: false, task };
  const scope = catalog.scope(who.tenant_id, who.agent_id);
  const policy = scope?.policy;
  const tool = scope?.tools.get(p.tool);
  if (!scope || !policy || !tool || !policy.auto_seq_enabled || !policy.auto_seq_execute)
    return { execute: false, task };
  // `auto_seq` too: the reference considers no tool without it, so a tool opted out of auto-seq is never run
  // without the model, whichever decider proposed it.
  if (!tool.spec.auto_seq || !tool.spec.auto_seq_execute || !tool.readOnly) return { execute: false, task };
  if (policy.denied_tools.includes(p.tool)) return { execute: false, task };
  // `auto_seq_from` narrows a tool to the upstream tools it may follow, whichever decider proposed it.
  if (tool.from && !tool.from.has(after.tool)) return { execute: false, task };
  // The call's visible_tools narrow the policy's, never widen them (as for typed candidates).
  if (policy.visible_tools && !policy.visible_tools.includes(p.tool)) return { execute: false, task };
  if (after.visible && !after.visible.includes(p.tool)) return { execute: false, task };
  if (holdsUnsafeInteger(p.args)) return { execute: false, task };
  // The typed decider's fingerprint (the payload's type and key names, whatever their values), so that the guard
  // holds across deciders and as documented: a fingerprint of the values never equalled the typed one (a learned
  // proposal ran the tool the typed guard had just stopped) and let a tool run on itself with new values.
  const fp = payloadShape(p.args, hash).payload_fingerprint;
  const same = task.last !== null && task.last.tool === p.tool && task.last.fp === fp;
  // Again, `pending` names the tool only when the decision it replaces was executable (any decision of the step
  // resets it, and only an executable learned one sets it where a message can propose again): that decision
  // passed the guard on this same tool and shape, with the run's count as it still is.
  const repeat = same && !(again && task.pending === p.tool);
  if (repeat || task.consecutive >= opts.maxConsecutive) return { execute: false, task };
  return { execute: true, task: { ...task, pending: p.tool, last: { tool: p.tool, fp } } };
}

/** The next-action record of a learned proposal (same contract as a typed unique decision). */
export function learnedRecord(
  e: ToolCallEvent,
  shape: PayloadShape,
  p: Proposal,
  execute: boolean,
): NextActionRecord {
  return withProposal(uniqueRecord(e, shape, p.tool, execute), p);
}

/**
 * The record of what is proposed after a later user message (see `proposeAfterMessage`): it replaces the one
 * published after the task's last call, whose `step` it names; `auto_seq_detected_none` when nothing is
 * proposed any more. No payload shape: a message has no output.
 */
export function messageRecord(
  e: UserMessageEvent & { task_id: string },
  step: number,
  p: Proposal | null,
  execute: boolean,
): NextActionRecord {
  const r = head({ ...e, step }, p ? 'auto_seq_detected_unique' : 'auto_seq_detected_none');
  if (!p) {
    r.candidates = [];
    r.candidate_count = 0;
    return r;
  }
  r.tool = p.tool;
  r.candidates = [p.tool];
  r.candidate_count = 1;
  r.execute = execute;
  return withProposal(r, p);
}

function withProposal(r: NextActionRecord, p: Proposal): NextActionRecord {
  r.origin = 'learned';
  if (p.rule_id !== null) r.rule_id = p.rule_id;
  r.rule_state = p.state;
  r.confidence = p.confidence ?? 0;
  r.trials = p.trials;
  r.args = p.args;
  return r;
}
