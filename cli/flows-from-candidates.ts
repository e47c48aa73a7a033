import { parseFlags } from '../shared/flags.js';
import { z } from 'zod';
import { flowCandidate, id as idSchema, type ToolCallsEvent } from '../schemas/index.js';
import { errorMessage } from '../shared/errors.js';
import {
  describeIssues,
  EXIT_UNREADABLE,
  inputFailure,
  readConfigFile,
  readEvents,
} from '../shared/jsonl.js';
import { offlineEnv } from '../services/flows/src/config.js';
import { evidenceOf } from '../services/flows/src/core/dataflow.js';
import { pastRunsOf } from '../services/flows/src/core/outcomes.js';
import { flowsFromCandidates } from '../services/flows/src/core/registry.js';

const USAGE = `Usage: paver flows from-candidates --input CANDIDATES.json [--history EVENTS.jsonl] [--tenant T --agent A]

Prints the flows file (the format \`paver select --flows\` reads) that the flows service would register for
the candidates in CANDIDATES.json (the output of \`paver detect\`): the same function promotion calls, so the
description and condition carry the candidates' request terms when they have them.

With --history (the stream the candidates were detected on), the file also carries the past runs of that
stream (first-request terms and the tools called, the newest FLOWS_OUTCOME_CAPACITY), and \`paver select\`
then ranks with past outcomes as the flows service does; and each step's input_map is learned from the
data flow of that stream (which earlier step's output, or the trigger input, fed each argument in every
occurrence of the flow; arguments with no consistent source are listed in \`unbound\`). Without --history
the candidates carry no argument data: steps say \`inputs: "unknown"\` and bind nothing.
`;

// Parsed by the shape the root has, not as a union: zod reports a union's failure as a bare "(root): Invalid
// input", so a candidate missing a field was never named.
const asList = z.array(flowCandidate);
const asObject = z.object({ candidates: asList });

export async function fromCandidatesCommand(argv: string[]): Promise<number> {
  const values = parseFlags('flows from-candidates', USAGE, argv, {
    input: { type: 'string' },
    history: { type: 'string' },
    tenant: { type: 'string' },
    agent: { type: 'string' },
    help: { type: 'boolean' },
  });
  if (typeof values === 'number') return values;
  if (!values.input) {
    process.stderr.write(`paver flows from-candidates: --input is required\n\n${USAGE}`);
    return 2;
  }
  const scope = { tenant: values.tenant ?? 'default', agent: values.agent ?? 'default' };
  if (!idSchema.safeParse(scope.tenant).success || !idSchema.safeParse(scope.agent).success) {
    process.stderr.write('paver flows from-candidates: bad --tenant/--agent\n');
    return 2;
  }
  let raw: unknown;
  try {
    raw = await readConfigFile(values.input);
  } catch (err) {
    process.stderr.write(`paver flows from-candidates: cannot read ${values.input}: ${errorMessage(err)}\n`);
    return EXIT_UNREADABLE;
  }
  const parsed = Array.isArray(raw)
    ? asList.safeParse(raw)
    : raw !== null && typeof raw === 'object'
      ? asObject.transform((o) => o.candidates).safeParse(raw)
      : null;
  if (!parsed?.success) {
    process.stderr.write(
      `paver flows from-candidates: ${values.input}: ${
        parsed
          ? describeIssues(parsed.error.issues)
          : 'expected a JSON array of candidates (what `paver detect` prints) or {"candidates": [...]}'
      }\n`,
    );
    return 2;
  }
  const cands = parsed.data;
  if (!values.history) {
    process.stdout.write(JSON.stringify(flowsFromCandidates(cands, scope), null, 2) + '\n');
    return 0;
  }
  // Checked before the history is read: a bad FLOWS_* variable is a usage error, not a crash at the end.
  let settings;
  try {
    settings = offlineEnv(process.env);
  } catch (err) {
    process.stderr.write(`paver flows from-candidates: FLOWS_* settings: ${errorMessage(err)}\n`);
    return 2;
  }
  const events: ToolCallsEvent[] = [];
  const warn = (s: string) => process.stderr.write(`paver flows from-candidates: ${s}\n`);
  try {
    for await (const e of readEvents(values.history, { lines: 0, bad: 0 }, warn))
      if (e.tenant_id === scope.tenant && e.agent_id === scope.agent) events.push(e);
  } catch (err) {
    const failed = inputFailure('flows from-candidates', values.history, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  const capacity = settings.FLOWS_OUTCOME_CAPACITY;
  // The service learns input_map from its last FLOWS_EVIDENCE_RUNS runs of the scope: so does this.
  const keep = settings.FLOWS_EVIDENCE_RUNS;
  const flows = flowsFromCandidates(cands, scope, keep > 0 ? evidenceOf(events).slice(-keep) : []);
  process.stdout.write(JSON.stringify({ flows, past_runs: pastRunsOf(events, capacity) }, null, 2) + '\n');
  return 0;
}
