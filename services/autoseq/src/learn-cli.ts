import { FlagError, numberFlag, parseFlags, type NumberRange } from '../../../shared/flags.js';
import { errorMessage } from '../../../shared/errors.js';
import { sha256 } from '../../../shared/hash.js';
import { inputFailure, readConfigFile, readEvents, stdoutLines } from '../../../shared/jsonl.js';
import { CatalogError, loadCatalogFile, type Catalog } from './core/catalog.js';
import {
  decide,
  DEFAULT_OPTIONS,
  newTaskState,
  rememberCall,
  type AutoseqOptions,
  type TaskState,
} from './core/decide.js';
import {
  applyEvent,
  MemoryLearnStore,
  predictProposal,
  taskId,
  typedProposal,
  type PredictLine,
} from './core/learn/engine.js';
import { DEFAULT_LEARN, listRules, type ArgsValidator, type LearnOptions } from './core/learn/learner.js';
import { learnedExecutable } from './core/learn/record.js';
import { SavingsCounter, type SavingsReport } from './core/learn/savings.js';
import { SchemaCompiler } from './core/schema-compiler.js';

const TUNING = `  [--max-k ${DEFAULT_LEARN.maxK}] [--min-trials ${DEFAULT_LEARN.minTrials}] [--min-precision ${DEFAULT_LEARN.minPrecision}] [--target-precision ${DEFAULT_LEARN.targetPrecision}] [--window ${DEFAULT_LEARN.window}] [--family-trials ${DEFAULT_LEARN.familyTrials}] [--max-slots ${DEFAULT_LEARN.maxSlots}] [--max-contexts ${DEFAULT_LEARN.maxContexts}] [--task-history ${DEFAULT_LEARN.historyPerTask}] [--max-consecutive ${DEFAULT_OPTIONS.maxConsecutive}]`;
const PREDICT_USAGE = `Usage: paver predict --input EVENTS.jsonl [--catalog FILE]
${TUNING}

Replays the file through autoseq's deciders (typed from the catalog, learned from the stream), learning only
from what came before each event, and prints exactly one JSON line per tool_call event, in input order:
{"event_id","task_id","proposal": null | {"tool","args","origin","state","rule_id","confidence"}}
where proposal is the best proposal held for that call before it was read. A tool_call line that is not a
valid event (reported on stderr) or repeats an event_id already read gets a line with proposal null.
`;
const SAVINGS_USAGE = `Usage: paver savings --input EVENTS.jsonl [--catalog FILE] [--json]
${TUNING}

Replays the file like \`paver predict\` and prints what active proposals would have saved: tool calls,
active proposals, hits, misses, coverage (hits / tool calls) and precision (hits / active proposals),
overall, per tool and per rule.
`;

export interface ReplayResult {
  lines: number;
  bad: number;
  events: number;
  savings: SavingsReport;
  rules: ReturnType<typeof listRules>;
  ms: number;
}

function validatorFor(catalog: Catalog | null): ArgsValidator | undefined {
  if (!catalog) return undefined;
  return (who, tool, args) => {
    const t = catalog.scope(who.tenant_id, who.agent_id)?.tools.get(tool);
    return t ? t.validate(args) : undefined;
  };
}

/** The shared replay behind `paver predict` and `paver savings`: the service's core over a file. */
export async function replay(
  input: string,
  opts: LearnOptions,
  catalog: Catalog | null,
  onLine: (line: PredictLine) => void,
  warn: (s: string) => void,
  progress?: (events: number) => void,
  /** A promise while the output cannot take more: the next event is read once it settles. */
  ready?: () => Promise<void> | undefined,
  /**
   * The typed decider's options (`--max-consecutive`, as the service's AUTOSEQ_MAX_CONSECUTIVE): its loop guard
   * decides whether a typed decision is held, so the service's limit must be the replay's to agree with it.
   */
  typedOpts: AutoseqOptions = DEFAULT_OPTIONS,
): Promise<ReplayResult> {
  const t0 = performance.now();
  const store = new MemoryLearnStore();
  const typed = new Map<string, TaskState>();
  const typedSeen = new Map<string, string[]>();
  const validate = validatorFor(catalog);
  const savings = new SavingsCounter();
  const stats = { lines: 0, bad: 0 };
  let events = 0;
  // One line per input tool_call, even a bad or repeated one (with no proposal): a consumer can align the
  // output with its input line for line.
  const badCall = (raw: unknown) => {
    if (raw === null || typeof raw !== 'object') return;
    const o = raw as Record<string, unknown>;
    if (o.type !== 'tool_call') return;
    // A call whose id is missing or not a string gets its line too ('', which no event id is): without it, every
    // line after it answered the input's call before.
    const event = typeof o.event_id === 'string' ? o.event_id : '';
    const task =
      typeof o.task_id === 'string' ? o.task_id : typeof o.session_id === 'string' ? o.session_id : '';
    onLine({ event_id: event, task_id: task, proposal: null });
    // Still an LLM step that nothing saved: `savings` counts it with the calls, as the output lines do.
    savings.add(typeof o.tool === 'string' ? o.tool : '(not read)', null, false);
  };
  for await (const e of readEvents(input, stats, warn, badCall)) {
    const wait = ready?.();
    if (wait) await wait;
    events++;
    if (progress && events % 10_000 === 0) progress(events);
    let typedNext = null;
    let typedTask: TaskState | null = null;
    if (e.type === 'tool_call') {
      // Seen by the typed decider: a repeat, which the service skips whole, with or without a catalog. The
      // learned step's own window of ids (user messages included) may have let it go.
      const id = taskId(e.tenant_id, e.agent_id, e.task_id);
      if (catalog) {
        const d = decide(e, catalog, typed.get(id) ?? newTaskState(), typedOpts, sha256);
        if (d.duplicate) {
          onLine({ event_id: e.event_id, task_id: e.task_id, proposal: null });
          continue;
        }
        typedTask = d.task;
        typed.set(id, d.task);
        typedNext = typedProposal(d.records, e.observation);
      } else {
        // Without a catalog the typed decider decides nothing: only its window of ids is kept.
        const seen = typedSeen.get(id) ?? [];
        if (seen.includes(e.event_id)) {
          onLine({ event_id: e.event_id, task_id: e.task_id, proposal: null });
          continue;
        }
        typedSeen.set(id, rememberCall(seen, e.event_id, typedOpts.seenPerTask));
      }
    }
    const r = applyEvent(store, e, opts, validate, typedNext);
    if (r?.duplicate && e.type === 'tool_call')
      onLine({ event_id: e.event_id, task_id: e.task_id, proposal: null });
    if (!r || r.duplicate) continue;
    // The typed state as the service's batch leaves it: a learned decision it published executable marks the
    // task's run (pending, loop guard), which decides whether the typed decider's next decision is held. Without
    // this, predict held typed decisions that the service's loop guard had refused.
    if (catalog && r.next?.origin === 'learned') {
      const tid = taskId(e.tenant_id, e.agent_id, e.task_id ?? '');
      if (e.type === 'tool_call' && typedTask && !typedNext)
        typed.set(
          tid,
          learnedExecutable(e, typedTask.prev, r.next, catalog, typedTask, typedOpts, sha256).task,
        );
      else if (e.type === 'user_message' && e.task_id !== undefined) {
        const task = typed.get(tid) ?? newTaskState();
        typed.set(tid, learnedExecutable(e, task.prev, r.next, catalog, task, typedOpts, sha256, true).task);
      }
    }
    if (e.type === 'tool_call') {
      onLine({ event_id: e.event_id, task_id: e.task_id, proposal: predictProposal(r.held) });
      savings.add(e.tool, r.held, r.heldHit);
    } else if (e.type === 'task_completed') savings.add(null, r.held, false);
  }
  const rules = [...store.scopes.values()].flatMap((s) => listRules(s, opts));
  return { ...stats, events, savings: savings.report(), rules, ms: performance.now() - t0 };
}

/**
 * The tuning flags and what each accepts: the ranges of the AUTOSEQ_LEARN_* variables the service reads for
 * the same settings (config.ts), so an offline run can always be reproduced by the service and back.
 */
const TUNING_FLAGS = {
  'max-k': { key: 'maxK', env: 'AUTOSEQ_LEARN_MAX_K', range: { min: 1, max: 8, integer: true } },
  'min-trials': {
    key: 'minTrials',
    env: 'AUTOSEQ_LEARN_MIN_TRIALS',
    range: { min: 1, max: 100_000, integer: true },
  },
  'min-precision': {
    key: 'minPrecision',
    env: 'AUTOSEQ_LEARN_MIN_PRECISION',
    range: { min: 0, max: 1, aboveMin: true, belowMax: true },
  },
  'target-precision': {
    key: 'targetPrecision',
    env: 'AUTOSEQ_LEARN_TARGET_PRECISION',
    range: { min: 0, max: 1 },
  },
  window: { key: 'window', env: 'AUTOSEQ_LEARN_WINDOW', range: { min: 2, max: 1_000_000, integer: true } },
  'family-trials': {
    key: 'familyTrials',
    env: 'AUTOSEQ_LEARN_FAMILY_TRIALS',
    range: { min: 0, max: 100_000, integer: true },
  },
  // The per-scope bounds change what is evicted, so what is learned: a service run with others than the defaults
  // is reproduced offline only with the same.
  'max-slots': {
    key: 'maxSlots',
    env: 'AUTOSEQ_LEARN_MAX_SLOTS',
    range: { min: 10, max: 1_000_000, integer: true },
  },
  'max-contexts': {
    key: 'maxContexts',
    env: 'AUTOSEQ_LEARN_MAX_CONTEXTS',
    range: { min: 10, max: 1_000_000, integer: true },
  },
  'task-history': {
    key: 'historyPerTask',
    env: 'AUTOSEQ_LEARN_TASK_HISTORY',
    range: { min: 1, max: 1000, integer: true },
  },
} as const satisfies Record<string, { key: keyof LearnOptions; env: string; range: NumberRange }>;

async function parse(cmd: string, argv: string[], usage: string, extra: Record<string, { type: 'boolean' }>) {
  const values = parseFlags(cmd, usage, argv, {
    input: { type: 'string' },
    catalog: { type: 'string' },
    ...Object.fromEntries(Object.keys(TUNING_FLAGS).map((f) => [f, { type: 'string' } as const])),
    'max-consecutive': { type: 'string' },
    help: { type: 'boolean' },
    ...extra,
  });
  if (typeof values === 'number') return values;
  if (!values.input) {
    process.stderr.write(`paver ${cmd}: --input is required\n\n${usage}`);
    return 2;
  }
  const opts: LearnOptions = { ...DEFAULT_LEARN };
  const typedOpts: AutoseqOptions = { ...DEFAULT_OPTIONS };
  try {
    for (const [flag, t] of Object.entries(TUNING_FLAGS))
      opts[t.key] = numberFlag(
        flag,
        (values as Record<string, unknown>)[flag] as string | undefined,
        DEFAULT_LEARN[t.key],
        t.range,
      );
    // AUTOSEQ_MAX_CONSECUTIVE's range, as `paver autoseq --max-consecutive`.
    typedOpts.maxConsecutive = numberFlag(
      'max-consecutive',
      values['max-consecutive'] as string | undefined,
      DEFAULT_OPTIONS.maxConsecutive,
      { min: 1, max: 1000, integer: true },
    );
  } catch (err) {
    if (!(err instanceof FlagError)) throw err;
    process.stderr.write(`paver ${cmd}: ${err.message}\n`);
    return 2;
  }
  let catalog: Catalog | null = null;
  const catalogFile = values.catalog as string | undefined;
  if (catalogFile) {
    try {
      catalog = loadCatalogFile(await readConfigFile(catalogFile), new SchemaCompiler());
    } catch (err) {
      process.stderr.write(
        `paver ${cmd}: ${err instanceof CatalogError ? '' : `cannot read ${catalogFile}: `}${errorMessage(err)}\n`,
      );
      return 2;
    }
  }
  return {
    input: values.input as string,
    opts,
    typedOpts,
    catalog,
    json: Boolean((values as Record<string, unknown>).json),
  };
}

const progressTo = (cmd: string) => (n: number) => process.stderr.write(`paver ${cmd}: ${n} events…\n`);

export async function predictCommand(argv: string[]): Promise<number> {
  const p = await parse('predict', argv, PREDICT_USAGE, {});
  if (typeof p === 'number') return p;
  const warn = (s: string) => process.stderr.write(`paver predict: ${s}\n`);
  const out = stdoutLines();
  try {
    const r = await replay(
      p.input,
      p.opts,
      p.catalog,
      (l) => out.push(JSON.stringify(l)),
      warn,
      progressTo('predict'),
      out.ready,
      p.typedOpts,
    );
    out.flush();
    if (r.bad > 0) warn(`${r.bad} bad line(s) skipped of ${r.lines}`);
  } catch (err) {
    out.flush();
    const failed = inputFailure('predict', p.input, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  return 0;
}

const pct = (x: number | null) => (x === null ? '-' : `${(100 * x).toFixed(1)}%`);

export function formatSavings(r: ReplayResult): string {
  const s = r.savings;
  const row = (name: string, t: SavingsReport['overall']) =>
    `${name.padEnd(44)} ${String(t.tool_calls).padStart(6)} ${String(t.active_proposals).padStart(7)} ${String(t.hits).padStart(6)} ${String(t.misses).padStart(6)} ${pct(t.coverage).padStart(8)} ${pct(t.precision).padStart(9)}`;
  const head = `${''.padEnd(44)} ${'calls'.padStart(6)} ${'active'.padStart(7)} ${'hits'.padStart(6)} ${'misses'.padStart(6)} ${'coverage'.padStart(8)} ${'precision'.padStart(9)}`;
  const lines = [
    `LLM steps saved: ${s.overall.hits} of ${s.overall.tool_calls} tool calls (coverage ${pct(s.overall.coverage)}, precision ${pct(s.overall.precision)})`,
    `shadow proposals: ${s.overall.shadow_proposals} (${s.overall.shadow_hits} would have hit); rules: ${r.rules.length} (${r.rules.filter((x) => x.state === 'active').length} active, ${r.rules.filter((x) => x.state === 'demoted').length} demoted)`,
    '',
    head,
    row('overall', s.overall),
    '',
    'per tool (proposed tool for proposals, actual tool for calls)',
    ...Object.entries(s.per_tool).map(([k, t]) => row(k.slice(0, 44), t)),
    '',
    'per rule (rules with active proposals)',
    ...Object.entries(s.per_rule).map(([k, t]) => {
      const rule = r.rules.find((x) => x.rule_id === k);
      const name = rule ? `${k} ${rule.context.join('>')}>${t.tool}` : `${k} ${t.tool}`;
      // Against all tool calls, as the overall row: a rule has no calls of its own.
      return row(name.slice(0, 44), { ...t, tool_calls: s.overall.tool_calls });
    }),
    '',
    'rules (all states, most trials first; bound = Wilson 95% lower bound of precision, the promotion test; exc = request terms blocking the rule)',
    `${'rule'.padEnd(17)} ${'state'.padEnd(7)} ${'trials'.padStart(6)} ${'hits'.padStart(6)} ${'bound'.padStart(6)} ${'exc'.padStart(4)}  context > tool [bindings]`,
    ...[...r.rules]
      .sort((a, b) => b.trials - a.trials)
      .slice(0, 15)
      .map(
        (x) =>
          `${x.rule_id.padEnd(17)} ${x.state.padEnd(7)} ${String(x.trials).padStart(6)} ${String(x.hits).padStart(6)} ${x.bound.toFixed(3).padStart(6)} ${String(x.exceptions).padStart(4)}  ${x.context.join('>')} > ${x.tool} [${x.bindings.map((b) => `${b.path.join('.')}:${b.source}`).join(', ')}]`,
      ),
  ];
  return lines.join('\n') + '\n';
}

export async function savingsCommand(argv: string[]): Promise<number> {
  const p = await parse('savings', argv, SAVINGS_USAGE, { json: { type: 'boolean' } });
  if (typeof p === 'number') return p;
  const warn = (s: string) => process.stderr.write(`paver savings: ${s}\n`);
  let r: ReplayResult;
  try {
    r = await replay(
      p.input,
      p.opts,
      p.catalog,
      () => undefined,
      warn,
      progressTo('savings'),
      undefined,
      p.typedOpts,
    );
  } catch (err) {
    const failed = inputFailure('savings', p.input, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  if (r.bad > 0) warn(`${r.bad} bad line(s) skipped of ${r.lines}`);
  if (p.json)
    process.stdout.write(
      JSON.stringify({ events: r.events, ms: Math.round(r.ms), savings: r.savings, rules: r.rules }) + '\n',
    );
  else process.stdout.write(formatSavings(r));
  return 0;
}
