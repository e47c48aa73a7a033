import { numberFlag, parseFlags } from '../../../shared/flags.js';
import { sha256 } from '../../../shared/hash.js';
import { inputFailure, readConfigFile, readEvents, stdoutLines } from '../../../shared/jsonl.js';
import { CatalogError, loadCatalogFile, type Catalog } from './core/catalog.js';
import { decide, DEFAULT_OPTIONS, newTaskState, type AutoseqOptions, type TaskState } from './core/decide.js';
import { SchemaCompiler } from './core/schema-compiler.js';
import { errorMessage } from '../../../shared/errors.js';

const USAGE = `Usage: paver autoseq --catalog FILE.(json|yaml) --input EVENTS.jsonl [--max-consecutive 5] [--no-arguments]

Runs autoseq's core over a JSONL file of tool-calls events (in file order, in memory) and prints one JSON
record per line: the decision for every tool_call event, plus auto_seq_executed when the agent ran a
unique decision. The same records the service publishes on the next-actions topic.
`;

/** Streams decisions to `write`; task state lives in a Map (the service keeps it in Redis). */
export async function runAutoseq(
  catalog: Catalog,
  input: string,
  opts: AutoseqOptions,
  write: (line: string) => void,
  warn: (s: string) => void,
  /** A promise while the output cannot take more: the next event is read once it settles. */
  ready?: () => Promise<void> | undefined,
) {
  const tasks = new Map<string, TaskState>();
  const stats = { lines: 0, bad: 0 };
  let decided = 0;
  for await (const e of readEvents(input, stats, warn)) {
    const wait = ready?.();
    if (wait) await wait;
    if (e.type !== 'tool_call') continue;
    const id = `${e.tenant_id}\u001f${e.agent_id}\u001f${e.task_id}`;
    const d = decide(e, catalog, tasks.get(id) ?? newTaskState(), opts, sha256);
    tasks.set(id, d.task);
    for (const r of d.records) write(JSON.stringify(r));
    decided++;
  }
  return { ...stats, decided };
}

export async function autoseqCommand(argv: string[]): Promise<number> {
  const values = parseFlags('autoseq', USAGE, argv, {
    catalog: { type: 'string' },
    input: { type: 'string' },
    'max-consecutive': { type: 'string' },
    'no-arguments': { type: 'boolean' },
    pretty: { type: 'boolean' },
    help: { type: 'boolean' },
  });
  if (typeof values === 'number') return values;
  if (!values.catalog || !values.input) {
    process.stderr.write(`paver autoseq: --catalog and --input are required\n\n${USAGE}`);
    return 2;
  }
  let max: number;
  try {
    // AUTOSEQ_MAX_CONSECUTIVE's range.
    max = numberFlag('max-consecutive', values['max-consecutive'], DEFAULT_OPTIONS.maxConsecutive, {
      min: 1,
      max: 1000,
      integer: true,
    });
  } catch (err) {
    process.stderr.write(`paver autoseq: ${errorMessage(err)}\n`);
    return 2;
  }
  let catalog: Catalog;
  try {
    catalog = loadCatalogFile(await readConfigFile(values.catalog), new SchemaCompiler());
  } catch (err) {
    process.stderr.write(
      `paver autoseq: ${err instanceof CatalogError ? '' : `cannot read ${values.catalog}: `}${errorMessage(err)}\n`,
    );
    return 2;
  }
  const warn = (s: string) => process.stderr.write(`paver autoseq: ${s}\n`);
  const out = stdoutLines();
  try {
    await runAutoseq(
      catalog,
      values.input,
      { ...DEFAULT_OPTIONS, maxConsecutive: max, includeArguments: !values['no-arguments'] },
      (l) => out.push(values.pretty ? JSON.stringify(JSON.parse(l), null, 2) : l),
      warn,
      out.ready,
    );
    out.flush();
  } catch (err) {
    out.flush();
    const failed = inputFailure('autoseq', values.input, err);
    process.stderr.write(failed.line);
    return failed.code;
  }
  return 0;
}
