import { readFileSync } from 'node:fs';
import { Command, CommanderError, Option } from 'commander';
import { inputTally, resetInputTally } from '../shared/jsonl.js';
import { faultFields } from '../shared/process-faults.js';
import { PLANNED_SERVICES, SERVICES, isServiceName } from './services.js';

/**
 * The `paver` command line. commander parses and validates every command first, so `--help` only prints
 * and an unknown flag exits 2 before anything starts; the commands' own modules are loaded lazily and get
 * their arguments as typed (each still parses them, which keeps them callable on their own).
 */

/**
 * Exit codes: 0 done, 1 failed (or --strict saw bad input), 2 usage error, a file given that cannot be read
 * (missing, a directory, over its limit: input and configuration files alike) or a configuration file refused.
 */
const USAGE_ERROR = 2;

function version(): string {
  // Source (cli/) and build (dist/cli/) sit at different depths below package.json.
  for (const rel of ['../../package.json', '../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === 'paver' && pkg.version) return pkg.version;
    } catch {
      // Not at this depth; try the next.
    }
  }
  return 'unknown';
}

interface Flags {
  strict?: boolean;
  pretty?: boolean;
}

const fullName = (c: Command): string => {
  const names: string[] = [];
  for (let x: Command | null = c; x; x = x.parent) names.unshift(x.name());
  return names.join(' ');
};

/** Options every command that reads tool-calls events shares. */
const STRICT = () => new Option('--strict', 'exit 1 when any input line was bad (the count goes to stderr)');
const PRETTY = () => new Option('--pretty', 'indented JSON instead of one JSON per line');
const INPUT = (what = 'tool-calls events, one JSON per line') =>
  new Option('--input <file>', `${what} ('-' reads stdin)`);

/** Commands that print their own bad-line count; the others get it from the shared reader's tally. */
const COUNT_THEIR_OWN = new Set(['predict', 'savings']);
/** Commands that report progress themselves. */
const HAS_OWN_PROGRESS = new Set(['predict', 'savings', 'flows replay']);
const PROGRESS_MS = 5000;

/**
 * Runs a command over the shared reader's tally: in every mode bad lines are counted on stderr, and with
 * --strict they turn a success into exit 1.
 */
async function offline(name: string, strict: boolean | undefined, run: () => Promise<number>) {
  resetInputTally();
  // Long runs say they are alive; a run shorter than the period prints nothing.
  let shown = 0;
  const progress = HAS_OWN_PROGRESS.has(name)
    ? undefined
    : setInterval(() => {
        if (inputTally.lines === shown) return;
        shown = inputTally.lines;
        process.stderr.write(`paver ${name}: ${shown} lines read…\n`);
      }, PROGRESS_MS).unref();
  let code: number;
  try {
    code = await run();
  } finally {
    clearInterval(progress);
  }
  if (inputTally.bad === 0) return code;
  if (!COUNT_THEIR_OWN.has(name) || strict)
    process.stderr.write(
      `paver ${name}: ${inputTally.bad} bad input line(s) skipped of ${inputTally.lines}${strict ? ' (--strict: exit 1)' : ''}\n`,
    );
  return strict && code === 0 ? 1 : code;
}

/** The options that name a file to read, where '-' is stdin. */
const FILE_OPTIONS = ['input', 'catalog', 'config', 'flows', 'history'];

/** argv without the flags paver handles itself, for commands that do not know them. */
const without = (args: string[], ...flags: string[]) => args.filter((a) => !flags.includes(a));

export function buildProgram(argv: string[], done: (code: number) => void): Command {
  // The argv after `paver NAME` (or `paver flows NAME`), passed on as typed.
  const after = (depth: number) => argv.slice(depth);
  const program = new Command('paver');
  program
    .description('paves the paths LLM agents keep walking (Kafka + Redis services and offline tools)')
    .version(version(), '-V, --version', 'print the version')
    .helpOption('-h, --help', 'print help')
    .helpCommand('help [command]', 'print help of a command')
    .showSuggestionAfterError(true)
    .exitOverride()
    .addHelpText(
      'after',
      `
Conventions: output is one JSON per line (--pretty indents it); --input - reads stdin; bad input lines are
counted on stderr and --strict turns them into exit 1; exit 2 is a usage error, a file given that cannot be
read (input or configuration), an --output that cannot be written, or a configuration file refused. Configuration files read
whole (--flows, --config, --catalog, '-' too) are refused when empty or over PAVER_MAX_CONFIG_BYTES (64 MiB).
Services take their settings from the environment (README "Configuration").

Examples:
  paver dev                                         local stack + every service, Ctrl-C stops all
  paver detect --input events.jsonl > candidates.json
  paver flows from-candidates --input candidates.json > flows.json
  paver select --flows flows.json --query "I want to change my flight" --pretty
  paver <command> --help                            options of one command
`,
    );

  // Every command reports a usage error as one line: what was wrong and its usage.
  const configure = (c: Command) =>
    c.exitOverride().configureOutput({
      outputError: (msg, write) =>
        write(
          `${fullName(c)}: ${msg
            .replace(/^error: /, '')
            .replace(/\s*\n\s*/g, ' ')
            .trim()} — usage: ${fullName(c)} ${c.usage()} (see --help)\n`,
        ),
    });
  configure(program);
  // stdin can be read once: with two options on '-' the second read nothing, and the command answered for an
  // empty file (exit 0, nothing out).
  program.hook('preAction', (_program, action) => {
    const opts = action.opts<Record<string, unknown>>();
    const onStdin = FILE_OPTIONS.filter((o) => opts[o] === '-');
    if (onStdin.length > 1)
      action.error(
        `${onStdin.map((o) => `--${o}`).join(' and ')} cannot both read stdin ('-'); give one a file`,
        {
          exitCode: USAGE_ERROR,
          code: 'paver.stdinTwice',
        },
      );
  });
  const sub = (parent: Command, name: string, summary: string) => {
    const c = parent.command(name).description(summary);
    configure(c);
    return c;
  };

  sub(program, 'run', 'run one long-lived service, configured from the environment')
    .argument('<service>', Object.keys(SERVICES).join(' | '))
    .addHelpText(
      'after',
      `\nServices:\n${Object.entries(SERVICES)
        .map(([n, s]) => `  ${n.padEnd(12)}${s.summary} (HTTP :${s.port})`)
        .join('\n')}${PLANNED_SERVICES.length ? `\n  (planned: ${PLANNED_SERVICES.join(', ')})` : ''}\n`,
    )
    .action(async (name: string) => {
      if (!isServiceName(name)) {
        process.stderr.write(
          PLANNED_SERVICES.includes(name)
            ? `paver run: service '${name}' is not built yet; available: ${Object.keys(SERVICES).join(', ')}\n`
            : `paver run: expected a service name (${Object.keys(SERVICES).join(', ')})\n`,
        );
        return done(USAGE_ERROR);
      }
      const mod = await SERVICES[name].load();
      done(await mod.run(process.env));
    });

  sub(program, 'dev', 'start the local stack (unless KAFKA_BROKERS/REDIS_URL are set) and every service')
    .option('--service <name>', 'only this service (repeatable)', (v: string, prev: string[] = []) => [
      ...prev,
      v,
    ])
    .action(async (opts: { service?: string[] }, cmd: Command) => {
      // Checked before the stack starts: dev looked an unknown name up only when launching it, a minute of
      // Kafka start later, and died on a TypeError with a stack trace (exit 1).
      const unknown = opts.service?.find((s) => !isServiceName(s));
      if (unknown !== undefined)
        cmd.error(`unknown service '${unknown}' (services: ${Object.keys(SERVICES).join(', ')})`, {
          exitCode: USAGE_ERROR,
          code: 'paver.unknownService',
        });
      const { dev } = await import('./dev.js');
      // Every declared option goes on, so options dev.ts learns need one line here, not a new parser.
      // Each service once: dev keeps one process per name, so a name given twice started a second one on the
      // same port (restarted for ever) and lost track of the first, which then outlived dev's stop.
      const args = { ...opts, services: [...new Set(opts.service ?? [])] };
      done(await dev(args));
    });

  sub(
    program,
    'stack',
    'start only the local stack, print KAFKA_BROKERS / REDIS_URL, wait for Ctrl-C',
  ).action(async () => {
    const m = await import('../deploy/local/stack.js');
    const { errorMessage } = await import('../shared/errors.js');
    let stack: Awaited<ReturnType<typeof m.startStack>>;
    try {
      stack = await m.startStack({ log: (s) => process.stderr.write(`${s}\n`) });
    } catch (err) {
      // As `paver dev` says it: the message is what to fix; thrown, it reached the user as a stack trace.
      process.stderr.write(`paver stack: the local stack did not start: ${errorMessage(err)}\n`);
      return done(1);
    }
    process.stdout.write(`KAFKA_BROKERS=${stack.brokers}\nREDIS_URL=${stack.redisUrl}\n`);
    await new Promise<void>((resolve) => {
      const stop = () => void stack.stop().then(resolve);
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    });
    done(0);
  });

  sub(program, 'publish', 'send tool-calls events (one JSON per line) to Kafka, keyed by session_id')
    .addOption(INPUT().makeOptionMandatory())
    .option('--topic <topic>', 'topic (default $PAVER_TOPIC_TOOL_CALLS)')
    .option('--tenant <tenant>', 'set tenant_id on every event')
    .option('--agent <agent>', 'set agent_id on every event')
    .action(async (opts: { input: string; topic?: string; tenant?: string; agent?: string }) => {
      const { publish } = await import('./publish.js');
      done(await publish(opts));
    });

  sub(program, 'gen-schemas', 'regenerate schemas/json from the zod contracts').action(async () => {
    await import('../schemas/generate.js').then((m) => m.writeSchemas());
    done(0);
  });

  const num = (flag: string, what: string) => new Option(`${flag} <n>`, what);

  sub(program, 'detect', 'repeated tool sequences in a JSONL file → flow candidates (one JSON array)')
    .addOption(INPUT().makeOptionMandatory())
    .addOption(num('--min-length', 'shortest sequence (default 3)'))
    .addOption(num('--max-length', 'longest sequence (default 12)'))
    .addOption(num('--min-occurrences', 'occurrences before a candidate (default 3)'))
    .addOption(num('--lookback', 'tasks remembered per scope (default 200)'))
    .addOption(num('--max-candidates', 'candidates kept (default 5)'))
    .addOption(num('--window-ms', 'only tasks this recent, in ms of event time (default: no time limit)'))
    .addOption(num('--task-idle-ms', 'a task without events this long is complete (default 1800000: 30 min)'))
    .addOption(
      num(
        '--done-retention-ms',
        'completed task ids remembered this long, in ms of event time (default: 86400000, a day, or --task-idle-ms if longer)',
      ),
    )
    .addOption(num('--max-task-events', 'events kept per task (default 1000)'))
    .addOption(new Option('--request-terms <on|off>', 'keep first-request terms (default on)'))
    .option('--tenant <tenant>', 'scope: tenant_id')
    .option('--agent <agent>', 'scope: agent_id')
    .addOption(PRETTY())
    .addOption(STRICT())
    .action(async (o: Flags) => {
      const { detectCommand } = await import('../services/detector/src/cli.js');
      done(await offline('detect', o.strict, () => detectCommand(without(after(1), '--strict'))));
    });

  sub(program, 'autoseq', "autoseq's decisions for every tool_call of a JSONL file (JSONL)")
    .requiredOption('--catalog <file>', 'tool catalog (JSON or YAML)')
    .addOption(INPUT().makeOptionMandatory())
    .addOption(num('--max-consecutive', 'automatic steps in a row (default 5)'))
    .option('--no-arguments', 'leave predicted arguments out')
    .addOption(PRETTY())
    .addOption(STRICT())
    .action(async (o: Flags) => {
      const { autoseqCommand } = await import('../services/autoseq/src/cli.js');
      done(await offline('autoseq', o.strict, () => autoseqCommand(without(after(1), '--strict'))));
    });

  // predict and savings replay the same learned core: the same input, catalog and tuning flags.
  const learned = (name: string, summary: string, extra: (c: Command) => Command = (c) => c) =>
    extra(
      sub(program, name, summary)
        .addOption(INPUT().makeOptionMandatory())
        .option('--catalog <file>', 'tool catalog (JSON or YAML)'),
    )
      // Defaults and ranges are the service's (AUTOSEQ_LEARN_*).
      .addOption(num('--max-k', 'longest context learned, 1..8 (default 3)'))
      .addOption(num('--min-trials', 'trials before a proposal is active, 1..100000 (default 20)'))
      .addOption(num('--min-precision', 'precision before a proposal is active, > 0 and < 1 (default 0.9)'))
      .addOption(num('--target-precision', 'precision an active rule must keep, 0..1 (default 0.95)'))
      .addOption(num('--window', 'trials remembered per context, 2..1000000 (default 400)'))
      .addOption(
        num('--family-trials', 'own trials of a rule whose family is proven, 0..100000 (default 8; 0: off)'),
      )
      .addOption(num('--max-slots', '(context, next tool) slots kept per scope, 10..1000000 (default 4000)'))
      .addOption(num('--max-contexts', 'contexts kept per scope, 10..1000000 (default 2000)'))
      .addOption(num('--task-history', 'calls of a task its bindings look back on, 1..1000 (default 32)'))
      .addOption(num('--max-consecutive', 'typed loop guard: automatic steps in a row, 1..1000 (default 5)'))
      .addOption(STRICT());

  learned('predict', 'one line per tool_call: the proposal held for it (JSONL)').action(async (o: Flags) => {
    const { predictCommand } = await import('../services/autoseq/src/learn-cli.js');
    done(await offline('predict', o.strict, () => predictCommand(without(after(1), '--strict'))));
  });

  learned('savings', 'LLM steps that active proposals would have saved', (c) =>
    c.option('--json', 'one JSON object instead of text'),
  ).action(async (o: Flags) => {
    const { savingsCommand } = await import('../services/autoseq/src/learn-cli.js');
    done(await offline('savings', o.strict, () => savingsCommand(without(after(1), '--strict'))));
  });

  sub(program, 'sequence', "the sequencer's state record per event of a JSONL file (JSONL)")
    .requiredOption('--config <file>', 'orchestration file (JSON or YAML)')
    .addOption(INPUT().makeOptionMandatory())
    .addOption(PRETTY())
    .addOption(STRICT())
    .action(async (o: Flags) => {
      const { sequenceCommand } = await import('../services/sequencer/src/cli.js');
      done(await offline('sequence', o.strict, () => sequenceCommand(without(after(1), '--strict'))));
    });

  sub(program, 'select', 'flow selection for one request over a flows file (one JSON line)')
    .requiredOption('--flows <file>', "flows file (JSON or YAML; '-' reads stdin)")
    .requiredOption('--query <text>', 'the user request')
    .option('--summary <text>', 'an episode summary (repeatable)')
    .addOption(num('--top-k', 'candidates considered (default FLOWS_TOP_K, 3)'))
    .addOption(num('--rrf-k', 'rank fusion constant (default FLOWS_RRF_K, 10)'))
    .addOption(num('--score-floor', 'choose nothing under this score (default FLOWS_SCORE_FLOOR, 0)'))
    .addOption(
      num(
        '--outcome-floor',
        'choose no flow whose past outcome is not above this (default FLOWS_OUTCOME_FLOOR, 0)',
      ),
    )
    .option('--fail-open', 'choose nothing when the model fails')
    .option('--tenant <tenant>', 'scope: tenant_id')
    .option('--agent <agent>', 'scope: agent_id')
    .addOption(PRETTY())
    .addHelpText(
      'after',
      '\nWith FLOWS_CHAT_URL set, several candidates go to that chat model (path "model", or "fallback" when it\n' +
        'fails); without it the top-ranked candidate is chosen (path "top_ranked").\n',
    )
    .action(async () => {
      const { selectCommand } = await import('../services/flows/src/cli.js');
      done(await selectCommand(after(1)));
    });

  sub(program, 'otel', 'OTLP/JSON trace export (GenAI spans) → tool-calls JSONL')
    .addOption(INPUT('the export file').makeOptionMandatory())
    .option('--output <file>', "where the JSONL goes (default '-', stdout)")
    .option('--tenant <tenant>', 'tenant_id when no span carries one')
    .option('--tenant-attribute <key>', 'span or resource attribute holding the tenant')
    .option('--no-payloads', 'leave tool arguments and results out')
    .addOption(
      num('--max-payload-bytes', 'leave out larger argument or result values (default 65536, ≤ 16 MiB)'),
    )
    .addOption(
      num(
        '--max-spans-per-message',
        'a request with more spans is bad, as in the service (default 10000, ≤ 1000000)',
      ),
    )
    .addOption(num('--max-input-bytes', 'refuse a larger export (default 256 MiB)'))
    .addOption(new Option('--strict', 'exit 1 when any request in the input was bad'))
    .addOption(PRETTY())
    .action(async () => {
      const { otelCommand } = await import('../services/ingest/src/cli.js');
      done(await otelCommand(after(1)));
    });

  const flows = sub(program, 'flows', 'flows offline (from-candidates, replay) and the flow registry');
  sub(flows, 'from-candidates', 'the flows file the flows service would register for `paver detect` output')
    .addOption(INPUT('candidates (the output of paver detect)').makeOptionMandatory())
    .option('--history <file>', "the stream the candidates came from ('-' reads stdin)")
    .option('--tenant <tenant>', 'scope: tenant_id')
    .option('--agent <agent>', 'scope: agent_id')
    .addOption(STRICT())
    .action(async (o: Flags) => {
      const { fromCandidatesCommand } = await import('./flows-from-candidates.js');
      done(
        await offline('flows from-candidates', o.strict, () =>
          fromCandidatesCommand(without(after(2), '--strict')),
        ),
      );
    });
  sub(flows, 'replay', 'detect → promotion → selection per user message; coverage and precision')
    .addOption(INPUT().makeOptionMandatory())
    .option('--json', 'one JSON object instead of text')
    .option('--flows <file>', 'hand-written flows registered first')
    .option('--promotion <mode>', 'auto | manual (default auto)')
    .addOption(num('--min-occurrences', 'promotion: occurrences'))
    .addOption(num('--min-savings', 'promotion: steps saved'))
    .addOption(num('--shadow-trials', 'promotion: shadow trials'))
    .addOption(num('--shadow-precision', 'promotion: shadow precision'))
    .option('--no-outcomes', 'rank without past outcomes')
    .addOption(STRICT())
    .action(async (o: Flags) => {
      const { replayCommand } = await import('./flows-replay.js');
      done(await offline('flows replay', o.strict, () => replayCommand(without(after(2), '--strict'))));
    });
  // The registry verbs talk HTTP to a running flows service.
  const registry = (name: string, summary: string, key: boolean) => {
    const c = sub(flows, name, summary)
      .option('--url <url>', 'flows service (default $FLOWS_URL or http://127.0.0.1:9104)')
      .option('--tenant <tenant>', 'scope: tenant_id')
      .option('--agent <agent>', 'scope: agent_id')
      .addOption(PRETTY());
    if (key) c.argument('<key>', "the candidate's dedupe_key");
    if (name === 'list') c.option('--status <status>', 'pending | promoted | rejected | retracted');
    c.action(async () => {
      const { flowsCommand } = await import('../services/flows/src/cli.js');
      done(await flowsCommand(after(1)));
    });
  };
  registry('list', 'flow candidates of a scope', false);
  registry('show', 'one flow candidate', true);
  registry('promote', 'promote a candidate to a flow', true);
  registry('reject', 'reject a candidate', true);
  registry('registry', 'the registered flows of a scope', false);

  return program;
}

/**
 * For every command but `run` (a service handles its own faults: shared/process-faults.ts), called by
 * bin/paver.js only, never by tests that call `main` in their own process. A fault no code caught (a promise
 * rejected that nobody awaits, a throw in a timer, an error out of a command) is a bug: Node's default ends the
 * run with exit 1 too, but its first line is a source excerpt and the message sits in the stack. Here the
 * first line names the command and the error, the stack follows for a report. Exit 1 at once, as before:
 * nothing of a half-done run is worth waiting for, and an `--output` file's temporary copy goes on 'exit'.
 */
export function exitOnFault(argv: string[]): void {
  const command = argv[0] !== undefined && !argv[0].startsWith('-') ? `paver ${argv[0]}` : 'paver';
  const onFault = (reason: unknown) => {
    const { err, stack } = faultFields(reason);
    process.stderr.write(
      `${command}: internal error (a bug; please report it): ${err}\n${stack ? `${stack}\n` : ''}`,
    );
    process.exit(1);
  };
  process.on('unhandledRejection', onFault);
  process.on('uncaughtException', onFault);
}

export async function main(argv: string[]): Promise<number> {
  let code: number | undefined;
  const program = buildProgram(argv, (c) => (code = c));
  try {
    await program.parseAsync(argv, { from: 'user' });
  } catch (err) {
    if (!(err instanceof CommanderError)) throw err;
    // --help and --version print and exit 0; `paver` alone prints help and exits 1 as before.
    if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version') return 0;
    if (err.code === 'commander.help' || err.code === 'commander.executeSubCommandAsync')
      return err.exitCode === 0 ? 0 : 1;
    return USAGE_ERROR;
  }
  return code ?? 0;
}
