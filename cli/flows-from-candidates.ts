import { parseArgs } from 'node:util';
import { z } from 'zod';
import { flowCandidate, id as idSchema } from '../schemas/index.js';
import { errorMessage } from '../shared/errors.js';
import { describeIssues, readConfigFile } from '../shared/jsonl.js';
import { flowsFromCandidates } from '../services/flows/src/core/registry.js';

const USAGE = `Usage: paver flows from-candidates --input CANDIDATES.json [--tenant T --agent A]

Prints the flows file (the format \`paver select --flows\` reads) that the flows service would register for
the candidates in CANDIDATES.json (the output of \`paver detect\`): the same function promotion calls, so the
description and condition carry the candidates' request terms when they have them.
`;

const input = z.union([z.array(flowCandidate), z.object({ candidates: z.array(flowCandidate) })]);

export async function fromCandidatesCommand(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        input: { type: 'string' },
        tenant: { type: 'string' },
        agent: { type: 'string' },
        help: { type: 'boolean' },
      },
    }));
  } catch (err) {
    process.stderr.write(`paver flows from-candidates: ${errorMessage(err)}\n\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
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
    return 1;
  }
  const parsed = input.safeParse(raw);
  if (!parsed.success) {
    process.stderr.write(
      `paver flows from-candidates: ${values.input}: ${describeIssues(parsed.error.issues)}\n`,
    );
    return 2;
  }
  const cands = Array.isArray(parsed.data) ? parsed.data : parsed.data.candidates;
  process.stdout.write(JSON.stringify(flowsFromCandidates(cands, scope), null, 2) + '\n');
  return 0;
}
