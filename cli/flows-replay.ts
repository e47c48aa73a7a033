import { access, constants, stat } from 'node:fs/promises';
import { numberFlag, parseFlags, type NumberRange } from '../shared/flags.js';
import {
  flowsFileV1,
  type FlowCandidateRecord,
  type RegisteredFlow,
  type ToolCallsEvent,
} from '../schemas/index.js';
import { errorMessage } from '../shared/errors.js';
import {
  describeIssues,
  EXIT_UNREADABLE,
  inputFailure,
  readConfigFile,
  readEvents,
} from '../shared/jsonl.js';
import { diffCandidates, retractedRecord, toRecord } from '../services/detector/src/core/candidate.js';
import { liveCandidates } from '../services/detector/src/core/detect.js';
import { scopeId, toOp, type Scope } from '../services/detector/src/core/ops.js';
import { DEFAULT_PARAMS } from '../services/detector/src/core/params.js';
import { DetectorState } from '../services/detector/src/core/state.js';
import { FlowsEngine, type CandidateStore } from '../services/flows/src/adapters/engine.js';
import { offlineEnv, policies, readPolicyFile } from '../services/flows/src/config.js';
import { OutcomeBook, flowTools } from '../services/flows/src/core/outcomes.js';
import type { PromotionPolicy, StoredCandidate } from '../services/flows/src/core/promotion.js';
import { PromptCache } from '../services/flows/src/core/prompt.js';
import { FlowRegistry, registerManual } from '../services/flows/src/core/registry.js';
import { matchSteps, type Match } from '../services/flows/src/core/score.js';
import { sessionKey } from '../services/flows/src/core/sessions.js';

/** The --flows file cannot be read or is not a flows file: the command line's to fix (exit 2), as in select. */
class FlowsFileError extends Error {}

const USAGE = `Usage: paver flows replay --input FILE.jsonl [--json] [--flows FILE] [--promotion auto|manual]
                          [--min-occurrences N] [--min-savings X] [--shadow-trials N] [--shadow-precision P]
                          [--no-outcomes]

Replays a tool-calls stream online, in file order, through what the services do: the detector's core
(candidates as each task completes), the flows service's promotion policy (shadow trials included), and
its selection for each user message (sparse recall and past outcomes; no model). From the point where the
agent first calls a chosen flow's first tool, the flow's steps are compared with what the agent did next;
the first mismatch ends the flow. Prints coverage (matched steps ÷ all tool calls) and precision (matched ÷
proposed), overall and per flow. Other settings come from FLOWS_* as for the service (FLOWS_POLICY_FILE's per-agent
overrides included; --promotion and the other flags win over them), except the promotion mode: auto unless the
flag or the agent's policy-file entry says otherwise (under FLOWS_PROMOTION's default, manual, a replay would
promote nothing). Progress goes to stderr.
`;

export interface ReplayOptions {
  input: string;
  /** Hand-written flows registered before the stream (the service's FLOWS_FILE). */
  flows?: string;
  promotion?: Partial<PromotionPolicy>;
  outcomes?: boolean;
  env?: NodeJS.ProcessEnv;
  progress?: (s: string) => void;
  warn?: (s: string) => void;
}

interface FlowStats {
  id: string;
  name: string;
  chosen: number;
  started: number;
  proposed: number;
  matched: number;
}

/** The replay itself, for the command, the protocol bench and the tests. */
export async function replay(o: ReplayOptions) {
  const env = offlineEnv(o.env ?? process.env);
  const pol = policies(env, await readPolicyFile(env));
  const promotionPolicy = (t: string, a: string): PromotionPolicy => ({
    ...pol.promotion(t, a),
    ...o.promotion,
  });
  const registry = new FlowRegistry();
  const candidates = new Map<string, StoredCandidate>();
  const ck = (t: string, a: string, k: string) => `${t}\u001f${a}\u001f${k}`;
  // One writer: every write finds what it read.
  const store: CandidateStore = {
    async read(t, a, keys) {
      const out = new Map<string, StoredCandidate>();
      for (const k of keys) {
        const c = candidates.get(ck(t, a, k));
        if (c) out.set(k, c);
      }
      return { candidates: out, versions: new Map() };
    },
    async write(t, a, _read, cs) {
      for (const c of cs) candidates.set(ck(t, a, c.record.dedupe_key), c);
      return true;
    },
    // Nothing is ever reconciled here: with one writer every write lands.
    flows: async () => [],
  };
  let clock = 0;
  const promoted: RegisteredFlow[] = [];
  const engine = new FlowsEngine({
    store,
    publishFlows: async (fs) => void promoted.push(...fs),
    selector: {
      registry,
      prompts: new PromptCache(),
      budgetMs: env.FLOWS_SELECT_BUDGET_MS,
      outcomes: new OutcomeBook(o.outcomes === false ? { ...pol.outcome(), capacity: 0 } : pol.outcome()),
    },
    promotionPolicy,
    selectPolicy: pol.select,
    // Event time, so that a replay decides the same whenever it runs.
    now: () => clock,
    evidenceRuns: env.FLOWS_EVIDENCE_RUNS,
  });
  if (o.flows) {
    const parsed = flowsFileV1.safeParse(
      await readConfigFile(o.flows).catch((err: unknown) => {
        throw new FlowsFileError(errorMessage(err));
      }),
    );
    if (!parsed.success) throw new FlowsFileError(`${o.flows}: ${describeIssues(parsed.error.issues)}`);
    for (const d of Array.isArray(parsed.data) ? parsed.data : parsed.data.flows)
      registry.upsert(registerManual(d, 0));
  }

  const detector = new DetectorState(DEFAULT_PARAMS);
  const published = new Map<string, Map<string, string>>();
  const candidateRecords = (scope: Scope): FlowCandidateRecord[] => {
    const prev = published.get(scopeId(scope)) ?? new Map<string, string>();
    const { upserts, retracts, next } = diffCandidates(
      prev,
      liveCandidates(detector.frequentStats(scope), DEFAULT_PARAMS),
    );
    published.set(scopeId(scope), next);
    return [
      ...upserts.map((c) => toRecord(c, scope, clock)),
      ...retracts.map((k) => retractedRecord(k, scope, clock)),
    ];
  };

  const choices: { session_id: string; event_id: string; path: string; chosen: string[] }[] = [];
  // By scope and session id, as the engine follows sessions: ids are the agents' own, so two tenants (or agents)
  // may both have an "s1" open. By id alone, one scope's end scored the other's chosen flow against its calls.
  const chosenFor = new Map<string, RegisteredFlow>();
  const callsOf = new Map<string, string[]>();
  const perFlow = new Map<string, FlowStats>();
  const total = { events: 0, tool_calls: 0, selections: 0, chosen: 0, proposed: 0, matched: 0 };
  const score = (session: string) => {
    const f = chosenFor.get(session);
    const calls = callsOf.get(session) ?? [];
    chosenFor.delete(session);
    callsOf.delete(session);
    if (!f) return;
    const m: Match = matchSteps(flowTools(f), calls);
    const s = perFlow.get(f.id) ?? { id: f.id, name: f.name, chosen: 0, started: 0, proposed: 0, matched: 0 };
    s.chosen++;
    if (m.proposed) s.started++;
    s.proposed += m.proposed;
    s.matched += m.matched;
    perFlow.set(f.id, s);
    total.proposed += m.proposed;
    total.matched += m.matched;
  };
  const stats = { lines: 0, bad: 0 };
  for await (const e of readEvents(o.input, stats, o.warn ?? (() => {}))) {
    total.events++;
    if (e.ts > clock) clock = e.ts;
    if (total.events % 5000 === 0) o.progress?.(`${total.events} events, ${total.selections} selections`);
    const op = toOp(e);
    const records: FlowCandidateRecord[] = [];
    if (op) {
      const r = detector.apply(op);
      // Candidates change only when a task completes (the detector publishes then).
      if (r.completed > 0) records.push(...candidateRecords(op.scope));
    }
    if (e.type === 'tool_call') {
      total.tool_calls++;
      const k = sessionKey(e.tenant_id, e.agent_id, e.session_id);
      const calls = callsOf.get(k) ?? [];
      calls.push(e.tool);
      callsOf.set(k, calls);
    }
    const sels = await engine.handle([{ kind: 'event', e } as { kind: 'event'; e: ToolCallsEvent }]);
    for (const s of sels) {
      total.selections++;
      choices.push({
        session_id: s.session_id,
        event_id: s.event_id,
        path: s.path,
        chosen: s.chosen.map((c) => c.id),
      });
      const f = s.chosen[0] && registry.get(s.tenant_id, s.agent_id, s.chosen[0].id);
      const k = sessionKey(s.tenant_id, s.agent_id, s.session_id);
      if (f && !chosenFor.has(k)) {
        total.chosen++;
        chosenFor.set(k, f);
      }
    }
    if (e.type === 'task_completed') score(sessionKey(e.tenant_id, e.agent_id, e.session_id));
    if (records.length) await engine.handle(records.map((r) => ({ kind: 'candidate' as const, r })));
  }
  for (const s of [...chosenFor.keys()]) score(s);
  const ratio = (a: number, b: number) => (b ? Number((a / b).toFixed(4)) : null);
  return {
    events: total.events,
    bad_lines: stats.bad,
    tool_calls: total.tool_calls,
    selections: total.selections,
    chosen: total.chosen,
    matched: total.matched,
    proposed: total.proposed,
    coverage: ratio(total.matched, total.tool_calls) ?? 0,
    precision: ratio(total.matched, total.proposed),
    promoted: promoted.length,
    promoted_flows: promoted.map((f) => ({ id: f.id, dedupe_key: f.dedupe_key ?? null, steps: f.steps })),
    candidates: [...candidates.values()].map((c) => ({
      dedupe_key: c.record.dedupe_key,
      status: c.status,
      shadow_trials: c.shadow_trials,
      shadow_precision: ratio(c.shadow_matched, c.shadow_proposed),
    })),
    per_flow: [...perFlow.values()]
      .sort((a, b) => b.matched - a.matched || (a.id < b.id ? -1 : 1))
      .map((s) => ({
        ...s,
        coverage: ratio(s.matched, total.tool_calls) ?? 0,
        precision: ratio(s.matched, s.proposed),
      })),
    choices,
  };
}

export async function replayCommand(argv: string[]): Promise<number> {
  const values = parseFlags('flows replay', USAGE, argv, {
    input: { type: 'string' },
    json: { type: 'boolean' },
    flows: { type: 'string' },
    promotion: { type: 'string' },
    'min-occurrences': { type: 'string' },
    'min-savings': { type: 'string' },
    'shadow-trials': { type: 'string' },
    'shadow-precision': { type: 'string' },
    'no-outcomes': { type: 'boolean' },
    help: { type: 'boolean' },
  });
  if (typeof values === 'number') return values;
  if (!values.input) {
    process.stderr.write(`paver flows replay: --input is required\n\n${USAGE}`);
    return 2;
  }
  if (values.promotion && values.promotion !== 'auto' && values.promotion !== 'manual') {
    process.stderr.write(`paver flows replay: --promotion must be auto or manual\n`);
    return 2;
  }
  // The ranges of the FLOWS_* variables the service reads for the same settings (config.ts).
  const num = (name: string, v: string | undefined, r: NumberRange) =>
    v === undefined ? undefined : numberFlag(name, v, 0, r);
  let promotion: Partial<PromotionPolicy>;
  try {
    const p = {
      mode: values.promotion as 'auto' | 'manual' | undefined,
      minOccurrences: num('min-occurrences', values['min-occurrences'], { min: 1, integer: true }),
      minSavings: num('min-savings', values['min-savings'], { min: 0 }),
      shadowTrials: num('shadow-trials', values['shadow-trials'], { min: 0, max: 1_000_000, integer: true }),
      shadowPrecision: num('shadow-precision', values['shadow-precision'], { min: 0, max: 1 }),
    };
    promotion = Object.fromEntries(Object.entries(p).filter(([, v]) => v !== undefined));
  } catch (err) {
    process.stderr.write(`paver flows replay: ${errorMessage(err)}\n`);
    return 2;
  }
  // Without --promotion, `auto`, unless FLOWS_POLICY_FILE says otherwise for an agent (as for the service).
  const env = { ...process.env, FLOWS_PROMOTION: 'auto' };
  try {
    await readPolicyFile(offlineEnv(env));
  } catch (err) {
    process.stderr.write(`paver flows replay: FLOWS_* settings: ${errorMessage(err)}\n`);
    return 2;
  }
  // Said as the sibling commands say it: which file, and that it could not be read.
  for (const file of [values.input, values.flows]) {
    if (file === undefined || file === '-') continue;
    try {
      await access(file, constants.R_OK);
      // A directory passes access(): reading it failed later with a bare EISDIR that named no file.
      if ((await stat(file)).isDirectory()) throw new Error('it is a directory');
    } catch (err) {
      process.stderr.write(`paver flows replay: cannot read ${file}: ${errorMessage(err)}\n`);
      return EXIT_UNREADABLE;
    }
  }
  let r;
  try {
    r = await replay({
      input: values.input,
      ...(values.flows ? { flows: values.flows } : {}),
      promotion,
      env,
      outcomes: !values['no-outcomes'],
      progress: (s) => process.stderr.write(`paver flows replay: ${s}\n`),
      warn: (s) => process.stderr.write(`paver flows replay: ${s}\n`),
    });
  } catch (err) {
    if (err instanceof FlowsFileError) {
      process.stderr.write(`paver flows replay: ${err.message}\n`);
      return EXIT_UNREADABLE;
    }
    const failed = inputFailure('flows replay', values.input, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  if (values.json) {
    process.stdout.write(JSON.stringify(r, null, 2) + '\n');
    return 0;
  }
  const pct = (x: number | null) => (x === null ? '—' : `${(x * 100).toFixed(1)}%`);
  const lines = [
    `events ${r.events}, tool calls ${r.tool_calls}, selections ${r.selections}, flows chosen ${r.chosen}, promoted ${r.promoted}`,
    `coverage ${pct(r.coverage)} (${r.matched}/${r.tool_calls})  precision ${pct(r.precision)} (${r.matched}/${r.proposed})`,
    '',
    'per flow:  chosen  started  matched/proposed  precision  coverage  name',
    ...r.per_flow.map(
      (f) =>
        `  ${String(f.chosen).padStart(14)} ${String(f.started).padStart(8)} ${`${f.matched}/${f.proposed}`.padStart(17)} ${pct(f.precision).padStart(10)} ${pct(f.coverage).padStart(9)}  ${f.name}`,
    ),
  ];
  process.stdout.write(lines.join('\n') + '\n');
  return 0;
}
