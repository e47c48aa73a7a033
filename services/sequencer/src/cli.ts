import { parseFlags } from '../../../shared/flags.js';
import { inputFailure, readConfigFile, readEvents, stdoutLines } from '../../../shared/jsonl.js';
import { ConfigError, loadOrchestrationFile, type Orchestrations } from './core/orchestration.js';
import {
  applyEvent,
  IGNORE_REASONS,
  newSession,
  type IgnoreReason,
  type SessionState,
} from './core/session.js';
import { errorMessage } from '../../../shared/errors.js';

const USAGE = `Usage: paver sequence --config FILE.(json|yaml) --input EVENTS.jsonl

Runs the sequencer's core over a JSONL file of tool-calls events (in file order, in memory) and prints one
state record per event (JSON lines): the records the service publishes on the sequence-state topic. An event
whose event_id the session has just seen (a redelivery) prints nothing, as in the service; nor does an event
of an agent with no orchestration in the file that lists no visible_tools (no tools known to allow), counted on
stderr at the end.
`;

export async function runSequence(
  config: Orchestrations,
  input: string,
  write: (line: string) => void,
  warn: (s: string) => void,
  /** A promise while the output cannot take more: the next event is read once it settles. */
  ready?: () => Promise<void> | undefined,
) {
  const sessions = new Map<string, SessionState>();
  const stats = { lines: 0, bad: 0, ignored: { tools_unknown: 0 } satisfies Record<IgnoreReason, number> };
  for await (const e of readEvents(input, stats, warn)) {
    const wait = ready?.();
    if (wait) await wait;
    const id = `${e.tenant_id}\u001f${e.agent_id}\u001f${e.session_id}`;
    const o = applyEvent(config.get(e.tenant_id, e.agent_id), sessions.get(id) ?? newSession(), e);
    if (o.ignored) stats.ignored[o.ignored]++;
    else sessions.set(id, o.state);
    if (o.record) write(JSON.stringify(o.record));
  }
  return stats;
}

export async function sequenceCommand(argv: string[]): Promise<number> {
  const values = parseFlags('sequence', USAGE, argv, {
    config: { type: 'string' },
    input: { type: 'string' },
    pretty: { type: 'boolean' },
    help: { type: 'boolean' },
  });
  if (typeof values === 'number') return values;
  if (!values.config || !values.input) {
    process.stderr.write(`paver sequence: --config and --input are required\n\n${USAGE}`);
    return 2;
  }
  let config: Orchestrations;
  try {
    config = loadOrchestrationFile(await readConfigFile(values.config));
  } catch (err) {
    process.stderr.write(
      `paver sequence: ${err instanceof ConfigError ? '' : `cannot read ${values.config}: `}${errorMessage(err)}\n`,
    );
    return 2;
  }
  const warn = (s: string) => process.stderr.write(`paver sequence: ${s}\n`);
  const out = stdoutLines();
  try {
    const stats = await runSequence(
      config,
      values.input,
      (l) => out.push(values.pretty ? JSON.stringify(JSON.parse(l), null, 2) : l),
      warn,
      out.ready,
    );
    out.flush();
    // Never silent, as the service's paver_sequencer_events_ignored_total.
    const ignored = IGNORE_REASONS.filter((r) => stats.ignored[r] > 0);
    if (ignored.length)
      warn(
        `events printing nothing: ${ignored.map((r) => `${stats.ignored[r]} ${r}`).join(', ')} (an agent with no orchestration in the file, no visible_tools)`,
      );
  } catch (err) {
    out.flush();
    const failed = inputFailure('sequence', values.input, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  return 0;
}
