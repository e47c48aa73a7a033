import { numberFlag, parseFlags } from '../../../shared/flags.js';
import { inputFailure, readEvents } from '../../../shared/jsonl.js';
import { liveCandidates } from './core/detect.js';
import { toOp, scopeId, type Scope } from './core/ops.js';
import { DEFAULT_PARAMS, validateParams, type DetectorParams } from './core/params.js';
import { DetectorState, emptyResult, IGNORE_REASONS } from './core/state.js';
import { errorMessage } from '../../../shared/errors.js';
import { id } from '../../../schemas/index.js';

const USAGE = `Usage: paver detect --input FILE.jsonl [--min-length 3] [--min-occurrences 3] [--lookback 200]
                    [--max-candidates 5] [--max-length 12] [--window-ms MS] [--task-idle-ms MS]
                    [--done-retention-ms MS] [--max-task-events 1000] [--request-terms on|off]
                    [--tenant T --agent A] [--pretty] [--strict]

Runs the detector's core over a JSONL file of tool-calls events (in file order, in memory; '-' reads stdin)
and prints the live candidates at the end as one JSON array on one line (--pretty indents it). Bad lines are reported on stderr with their line number, skipped
and counted. Without --tenant/--agent the file must hold one (tenant, agent) scope.

Each numeric flag is the DETECTOR_* variable of the same name, with its default and range; --done-retention-ms
defaults to the larger of 86400000 and --task-idle-ms, the least the service accepts with that idle time.

--request-terms (on by default, like DETECTOR_REQUEST_TERMS) keeps the terms of each task's first user
message (lower-cased words; stop words, numbers and identifiers removed; never the text) and adds their
statistics to each candidate as request_terms and to its proposed flow's description.
`;

export async function detect(
  input: string,
  params: DetectorParams,
  filter: Partial<Scope>,
  warn: (s: string) => void,
) {
  const state = new DetectorState(params);
  const stats = { lines: 0, bad: 0 };
  const result = emptyResult();
  for await (const event of readEvents(input, stats, warn)) {
    const op = toOp(event, params.requestTerms);
    if (!op) continue;
    if (
      (filter.tenant && op.scope.tenant !== filter.tenant) ||
      (filter.agent && op.scope.agent !== filter.agent)
    )
      continue;
    state.apply(op, result);
  }
  return { state, ...stats, ignoredBy: result.ignoredBy };
}

export async function detectCommand(argv: string[]): Promise<number> {
  const values = parseFlags('detect', USAGE, argv, {
    input: { type: 'string' },
    'min-length': { type: 'string' },
    'max-length': { type: 'string' },
    'min-occurrences': { type: 'string' },
    lookback: { type: 'string' },
    'max-candidates': { type: 'string' },
    'window-ms': { type: 'string' },
    'task-idle-ms': { type: 'string' },
    'done-retention-ms': { type: 'string' },
    'max-task-events': { type: 'string' },
    'request-terms': { type: 'string' },
    tenant: { type: 'string' },
    agent: { type: 'string' },
    pretty: { type: 'boolean' },
    help: { type: 'boolean' },
  });
  if (typeof values === 'number') return values;
  if (!values.input) {
    process.stderr.write(`paver detect: --input is required\n\n${USAGE}`);
    return 2;
  }
  // The ranges of the DETECTOR_* variables the service reads for the same settings (config.ts).
  const num = (name: string, v: string | undefined, dflt: number, max = Number.MAX_SAFE_INTEGER): number =>
    numberFlag(name, v, dflt, { min: 1, max, integer: true });
  const onOff = (name: string, v: string | undefined, dflt: boolean): boolean => {
    if (v === undefined) return dflt;
    if (v === 'on' || v === 'true') return true;
    if (v === 'off' || v === 'false') return false;
    throw new Error(`--${name} must be on or off`);
  };
  let params: DetectorParams;
  try {
    params = {
      ...DEFAULT_PARAMS,
      minLength: num('min-length', values['min-length'], DEFAULT_PARAMS.minLength, 100),
      maxLength: num('max-length', values['max-length'], DEFAULT_PARAMS.maxLength, 100),
      minOccurrences: num(
        'min-occurrences',
        values['min-occurrences'],
        DEFAULT_PARAMS.minOccurrences,
        1_000_000,
      ),
      lookback: num('lookback', values.lookback, DEFAULT_PARAMS.lookback, 1_000_000),
      maxCandidates: num('max-candidates', values['max-candidates'], DEFAULT_PARAMS.maxCandidates, 1000),
      windowMs: values['window-ms'] === undefined ? null : num('window-ms', values['window-ms'], 1),
      taskIdleMs: num('task-idle-ms', values['task-idle-ms'], DEFAULT_PARAMS.taskIdleMs),
      maxTaskEvents: num('max-task-events', values['max-task-events'], DEFAULT_PARAMS.maxTaskEvents, 100_000),
      requestTerms: onOff('request-terms', values['request-terms'], DEFAULT_PARAMS.requestTerms),
    };
    // A completed task's id must be remembered at least as long as a task may idle, as the service requires
    // (DETECTOR_DONE_RETENTION_MS ≥ DETECTOR_TASK_IDLE_MS): with a shorter memory a late event of a closed task
    // opens it again and that fragment replaces its whole record, where the service ignores the event as late.
    params.doneRetentionMs = num(
      'done-retention-ms',
      values['done-retention-ms'],
      Math.max(DEFAULT_PARAMS.doneRetentionMs, params.taskIdleMs),
    );
    if (params.doneRetentionMs < params.taskIdleMs)
      throw new Error(
        `--done-retention-ms (${params.doneRetentionMs}) must be ≥ --task-idle-ms (${params.taskIdleMs}): a late event of a task closed as idle would reopen it`,
      );
    if (params.maxLength < params.minLength)
      throw new Error(
        `--max-length (${params.maxLength}) must be ≥ --min-length (${params.minLength}); set both to search longer sequences only`,
      );
    // As DETECTOR_MIN_OCCURRENCES ≤ DETECTOR_LOOKBACK: support counts the window's tasks, so more could never be met.
    if (params.minOccurrences > params.lookback)
      throw new Error(
        `--min-occurrences (${params.minOccurrences}) must be ≤ --lookback (${params.lookback}), the tasks occurrences are counted in`,
      );
    const errs = validateParams(params);
    if (errs.length) throw new Error(errs.join('; '));
    // An empty one was read as no filter at all, silently.
    for (const flag of ['tenant', 'agent'] as const)
      if (values[flag] !== undefined && !id.safeParse(values[flag]).success)
        throw new Error(`--${flag} must be an id (1-256 printable characters)`);
  } catch (err) {
    process.stderr.write(`paver detect: ${errorMessage(err)}\n`);
    return 2;
  }
  const warn = (s: string) => process.stderr.write(`paver detect: ${s}\n`);
  let result;
  try {
    result = await detect(
      values.input,
      params,
      {
        ...(values.tenant ? { tenant: values.tenant } : {}),
        ...(values.agent ? { agent: values.agent } : {}),
      },
      warn,
    );
  } catch (err) {
    const failed = inputFailure('detect', values.input, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  const scopes = result.state.scopesSeen();
  let scope: Scope;
  if (values.tenant || values.agent) {
    scope = { tenant: values.tenant ?? 'default', agent: values.agent ?? 'default' };
    // An empty answer for a scope the file does not hold is a typo more often than a fact: say so.
    if (!scopes.some((s) => scopeId(s) === scopeId(scope)))
      warn(`no events of ${scope.tenant}/${scope.agent} in the file: no candidates`);
  } else if (scopes.length <= 1) scope = scopes[0] ?? { tenant: 'default', agent: 'default' };
  else {
    warn(
      `the file holds ${scopes.length} scopes (${scopes
        .map((s) => scopeId(s).replace('\u001f', '/'))
        .slice(0, 5)
        .join(', ')}…): choose one with --tenant and --agent`,
    );
    return 2;
  }
  process.stdout.write(
    JSON.stringify(
      liveCandidates(result.state.frequentStats(scope), params, result.state.windowRecords(scope)),
      null,
      values.pretty ? 2 : undefined,
    ) + '\n',
  );
  // Never silent: events not used are counted by reason, as the service's metric does.
  const ignored = IGNORE_REASONS.filter((r) => result.ignoredBy[r] > 0);
  if (ignored.length > 0)
    warn(`events not used: ${ignored.map((r) => `${result.ignoredBy[r]} ${r}`).join(', ')}`);
  return 0;
}
