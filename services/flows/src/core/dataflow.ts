/**
 * A flow's `input_map` from data flow: which earlier step's output (or the trigger input) fed each argument
 * of each step in past runs, kept only when one source reproduced the argument in (nearly: `agreement`)
 * every occurrence seen. Uses the argument-binding core that autoseq's learned decider uses (shared/core/bindings.ts).
 *
 * Reference syntax (strings, as `input_map` holds them):
 * - `{{step_N.output.a.b[0]}}` / `{{step_N.input.a}}`: a path in an earlier step's output / arguments;
 * - `{{item.a}}`: the current element of the step's `for_each` list (`for_each.over` = `{{step_N.output.list}}`);
 * - `{{_trigger.input ~ /PATTERN/ #I}}`: the I-th token of the trigger input matching PATTERN;
 * - `{{const JSON}}`: the same (short) value every time.
 */
import { setOwn } from '../../../../shared/core/own.js';
import {
  DEFAULT_ENUMERATE,
  enumerateArgs,
  type Path,
  type PastCall,
  type Source,
} from '../../../../shared/core/bindings.js';
import type { FlowStep, ToolCallsEvent } from '../../../../schemas/index.js';
import { planOf } from './score.js';
import { completedRuns, jsonChars } from './sessions.js';

/** One past run as evidence: its calls with arguments and outputs, and its first user message. */
export interface EvidenceRun {
  userText?: string | undefined;
  calls: PastCall[];
}

export interface DataFlowOptions {
  /** Fewest occurrences of the flow (observations of a step) before a binding counts as validated. */
  minOccurrences: number;
  /** Most recent occurrences examined per flow (bounds work). */
  maxOccurrences: number;
  /**
   * Share of a step's observations a source must reproduce: agents occasionally deviate (skip an element, retry
   * with a typo), and a rule that tolerates no deviation would leave almost everything unbound.
   */
  agreement: number;
}
export const DEFAULT_DATAFLOW: DataFlowOptions = { minOccurrences: 2, maxOccurrences: 20, agreement: 0.8 };

const ENUMERATE = { ...DEFAULT_ENUMERATE, maxSources: 32 };

/** `a.b[0]` for a path (how input_map keys and references name places). */
export function pathText(p: Path): string {
  return p.map((s, i) => (typeof s === 'number' ? `[${s}]` : i === 0 ? s : `.${s}`)).join('');
}
const under = (base: string, p: Path) =>
  p.length === 0 ? base : `${base}${typeof p[0] === 'number' ? '' : '.'}${pathText(p)}`;

/**
 * Where the flow's occurrence is in a run, as the scorer finds it (first call of the first tool, loops taking
 * as many complete repetitions as the run made): per step, the call indices it ran at; null when the run
 * does not complete the flow.
 */
export function occurrenceOf(steps: readonly FlowStep[], calls: readonly PastCall[]): number[][] | null {
  const plan = planOf(steps);
  if (!plan.length) return null;
  const start = calls.findIndex((c) => c.tool === plan[0]!.tool);
  if (start < 0) return null;
  const at: number[][] = plan.map(() => []);
  let c = start;
  for (let i = 0; i < plan.length;) {
    const body = Math.min(plan[i]!.body ?? 1, plan.length - i);
    const fits = () =>
      c + body <= calls.length && plan.slice(i, i + body).every((p, j) => calls[c + j]!.tool === p.tool);
    if (!fits()) return null;
    do {
      for (let j = 0; j < body; j++) at[i + j]!.push(c + j);
      c += body;
    } while (plan[i]!.body !== undefined && fits());
    i += body;
  }
  return at;
}

/** A source as a reference the flow can resolve, or null when it points outside the flow. */
function referenceOf(s: Source, steps: readonly FlowStep[], i: number, inLoop: boolean): string | null {
  const stepOf = (tool: string) => {
    for (let j = i - 1; j >= 0; j--) if (steps[j]!.skill_key === tool) return j;
    return -1;
  };
  switch (s.kind) {
    // `prev` is also enumerated as `last` of the same call; inside a loop "previous" is the step itself.
    case 'prev':
      return null;
    case 'last': {
      const j = stepOf(s.tool);
      return j < 0 ? null : `{{${under(`step_${j + 1}.${s.part === 'out' ? 'output' : 'input'}`, s.path)}}}`;
    }
    case 'loop': {
      if (!inLoop) return null;
      const j = stepOf(s.tool);
      if (j < 0) return null;
      return `{{${under('item', s.item)}}}\u0000{{${under(`step_${j + 1}.${s.part === 'out' ? 'output' : 'input'}`, s.list)}}}`;
    }
    // The element mentioning the request has no reference in the flow template language.
    case 'pick':
      return null;
    case 'user':
      return `{{_trigger.input ~ /${s.pattern}/ #${s.index}}}`;
    // Flows learn from the first message only (the trigger's input): never enumerated here.
    case 'said':
      return null;
    case 'const':
      return `{{const ${JSON.stringify(s.value)}}}`;
  }
}

/**
 * The steps with `input_map` learned from the runs (see the module comment), `unbound` listing the argument
 * paths past runs passed that no source explained in every occurrence, and a loop's `for_each.over` when its
 * elements came from an earlier step's list. Too few occurrences: unchanged (`inputs: 'unknown'`).
 */
export function learnInputs(
  steps: readonly FlowStep[],
  runs: readonly EvidenceRun[],
  opts: DataFlowOptions = DEFAULT_DATAFLOW,
): FlowStep[] {
  const occ: { run: EvidenceRun; at: number[][] }[] = [];
  for (let r = runs.length - 1; r >= 0 && occ.length < opts.maxOccurrences; r--) {
    const at = occurrenceOf(steps, runs[r]!.calls);
    if (at) occ.push({ run: runs[r]!, at });
  }
  if (occ.length < opts.minOccurrences) return [...steps];
  // Which loop (head index) each step belongs to, if any.
  const loopHead: (number | null)[] = steps.map(() => null);
  steps.forEach((s, i) => {
    const body = s.for_each?.body;
    if (body !== undefined) for (let j = i; j < Math.min(steps.length, i + body); j++) loopHead[j] = i;
  });
  const overs = new Map<number, Set<string> | null>();
  const learned = steps.map((step, i) => {
    const inLoop = loopHead[i] !== null;
    // Per argument path: in how many observations each reference reproduced it (first-seen order = preference).
    const counts = new Map<string, Map<string, number>>();
    let observations = 0;
    for (const { run, at } of occ) {
      for (const c of at[i]!) {
        const call = run.calls[c]!;
        const units = enumerateArgs(
          { calls: run.calls.slice(0, c), userText: run.userText },
          step.skill_key,
          call.args,
          ENUMERATE,
        );
        observations++;
        for (const u of units) {
          const k = pathText(u.path);
          let m = counts.get(k);
          if (!m) counts.set(k, (m = new Map()));
          const refs = new Set(
            u.sources.map((s) => referenceOf(s, steps, i, inLoop)).filter((x): x is string => x !== null),
          );
          for (const r of refs) m.set(r, (m.get(r) ?? 0) + 1);
        }
      }
    }
    const need = Math.max(opts.minOccurrences, Math.ceil(opts.agreement * observations));
    const inputMap: Record<string, string> = {};
    const unbound: string[] = [];
    for (const k of [...counts.keys()].sort()) {
      let ref: string | undefined;
      let best = 0;
      for (const [r, n] of counts.get(k)!) if (n > best) [ref, best] = [r, n];
      if (ref === undefined || best < need) {
        unbound.push(k);
        continue;
      }
      const [value, over] = ref.split('\u0000') as [string, string | undefined];
      setOwn(inputMap, k, value); // an argument's name: `__proto__` must stay a key
      if (over !== undefined) {
        const head = loopHead[i]!;
        const cur = overs.get(head);
        if (cur !== null) overs.set(head, new Set([...(cur ?? []), over]));
      }
    }
    return { ...step, input_map: inputMap, inputs: 'data_flow' as const, unbound };
  });
  // A loop walks one list: named only when every element-bound argument of the body points at the same one.
  return learned.map((s, i) => {
    const o = overs.get(i);
    if (!s.for_each || !o || o.size !== 1) return s;
    return { ...s, for_each: { ...s.for_each, over: [...o][0]! } };
  });
}

/** Past runs kept per scope for `input_map` learning by default (the protocol's history is 200 runs). */
export const DEFAULT_EVIDENCE_RUNS = 200;
/**
 * JSON characters of evidence held in memory by default, by the kept runs of every scope together, and again by
 * the open sessions (`SessionTracker`): 64 Mi each, a few hundred MB of heap at most for both.
 */
export const DEFAULT_EVIDENCE_MAX_CHARS = 64 * 1024 * 1024;

/** A run's size as the evidence bounds count it: its request text and its calls' arguments and outputs. */
export function evidenceChars(run: EvidenceRun): number {
  let n = run.userText?.length ?? 0;
  for (const c of run.calls) n += jsonChars(c.args) + jsonChars(c.observation);
  return n;
}

/**
 * The live service's evidence: per (tenant, agent), the last `capacity` finished runs with their arguments,
 * outputs and first request, newest last; what `flowFromCandidate` learns `input_map` from at promotion, as
 * `paver flows from-candidates --history` does from a file. In memory only (it holds arguments and request
 * text; never logged, never written out), so a restart starts it empty and it refills as runs finish.
 */
export class EvidenceBook {
  private readonly scopes = new Map<string, EvidenceRun[]>();
  /** Every kept run, oldest first, with its scope and size: the whole book's bound evicts from the front. */
  private readonly kept = new Map<EvidenceRun, { scope: string; chars: number }>();
  private total = 0;
  /**
   * `maxChars`: JSON characters of arguments, outputs and request text held by the whole book, every scope
   * together (FLOWS_EVIDENCE_MAX_CHARS). Per scope only, runs × scopes had no bound: 200 runs of up to 256 KB
   * in each of a thousand agents' scopes is 51 GB. Past it, the oldest runs of any scope go first.
   */
  constructor(
    readonly capacity: number = DEFAULT_EVIDENCE_RUNS,
    readonly maxChars: number = DEFAULT_EVIDENCE_MAX_CHARS,
  ) {}
  add(tenant: string, agent: string, run: EvidenceRun, chars = evidenceChars(run)): void {
    if (this.capacity <= 0) return;
    const k = `${tenant}\u001f${agent}`;
    let runs = this.scopes.get(k);
    if (!runs) this.scopes.set(k, (runs = []));
    runs.push(run);
    this.kept.set(run, { scope: k, chars });
    this.total += chars;
    if (runs.length > this.capacity)
      for (const gone of runs.splice(0, runs.length - this.capacity)) this.forget(gone);
    while (this.total > this.maxChars && this.kept.size > 0) {
      const [oldest, { scope }] = this.kept.entries().next().value as [EvidenceRun, { scope: string }];
      // The oldest run of the book is the oldest of its scope: each scope's list is in the book's order.
      const list = this.scopes.get(scope)!;
      list.shift();
      if (list.length === 0) this.scopes.delete(scope);
      this.forget(oldest);
    }
  }
  private forget(run: EvidenceRun): void {
    const k = this.kept.get(run);
    if (!k) return;
    this.kept.delete(run);
    this.total -= k.chars;
  }
  /** JSON characters the book holds (what `maxChars` bounds). */
  get chars(): number {
    return this.total;
  }
  runs(tenant: string, agent: string): readonly EvidenceRun[] {
    return this.scopes.get(`${tenant}\u001f${agent}`) ?? [];
  }
}

/** Past runs as evidence (their first request and calls), the runs the service would have kept (`completedRuns`). */
export function evidenceOf(events: Iterable<ToolCallsEvent>): EvidenceRun[] {
  return completedRuns(events, true).map((s) => ({
    ...(s.userText !== undefined ? { userText: s.userText } : {}),
    calls: s.evidence ?? [],
  }));
}
