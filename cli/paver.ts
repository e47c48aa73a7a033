import { parseArgs } from 'node:util';
import { PLANNED_SERVICES, SERVICES, isServiceName } from './services.js';

const HELP = `paver — paves the paths LLM agents keep walking (Kafka + Redis services)

Usage: paver <command> [options]

Services (long-running, configured from the environment; see README "Configuration"):
${Object.entries(SERVICES)
  .map(([name, s]) => `  run ${name.padEnd(16)}${s.summary} (HTTP :${s.port})`)
  .join('\n')}${PLANNED_SERVICES.length ? `\n  (planned: ${PLANNED_SERVICES.join(', ')})` : ''}

Main job:
  dev [--service NAME ...]   start the local stack (Kafka KRaft + redis-server, unless KAFKA_BROKERS /
                             REDIS_URL are set) and every service; Ctrl-C stops all of it

Tools:
  stack                      start only the local stack, print KAFKA_BROKERS / REDIS_URL, wait for Ctrl-C
  publish --input FILE.jsonl [--topic T] [--tenant T] [--agent A]
                             send tool-calls events (one JSON per line) keyed by session_id;
                             --tenant/--agent set tenant_id/agent_id on every event (needs only KAFKA_BROKERS)
  gen-schemas                regenerate schemas/json from the zod contracts

Offline (no Kafka, no Redis; same core as the services):
  detect --input FILE.jsonl [--min-length 3] [--min-occurrences 3] [--lookback 200]
         [--max-candidates 5] [--max-length 12] [--tenant T --agent A]
  autoseq --catalog FILE --input FILE.jsonl [--max-consecutive 5] [--no-arguments]
  predict --input FILE.jsonl [--catalog FILE]   one line per tool_call: the proposal held for it
  savings --input FILE.jsonl [--json]           LLM steps active proposals would have saved
  sequence --config FILE --input FILE.jsonl
  select --flows FILE --query TEXT [--summary TEXT ...] [--top-k 3] [--fail-open]
  flows from-candidates --input CANDIDATES.json
                             the flows file the flows service would register for \`paver detect\` output
  flows replay --input FILE.jsonl [--json] [--flows FILE] [--promotion auto|all|manual]
                             detect → promotion → selection per user message; coverage and precision
  otel --input FILE|- [--output FILE|-]
                             OTLP/JSON trace export (GenAI spans) → tool-calls JSONL

Flow registry (talks to a running flows service):
  flows list|show KEY|promote KEY|reject KEY|registry [--url URL] [--tenant T --agent A]

  paver <command> --help     options of one command
`;

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  if (!cmd || cmd === '--help' || cmd === '-h' || cmd === 'help') {
    process.stdout.write(HELP);
    return cmd ? 0 : 1;
  }
  switch (cmd) {
    case 'run': {
      const name = rest[0];
      if (!name || !isServiceName(name)) {
        const planned = PLANNED_SERVICES.includes(name ?? '');
        process.stderr.write(
          planned
            ? `paver run: service '${name}' is not built yet; available: ${Object.keys(SERVICES).join(', ')}\n`
            : `paver run: expected a service name (${Object.keys(SERVICES).join(', ')})\n`,
        );
        return 2;
      }
      const mod = await SERVICES[name].load();
      return mod.run(process.env);
    }
    case 'dev': {
      const { values } = parseArgs({ args: rest, options: { service: { type: 'string', multiple: true } } });
      const { dev } = await import('./dev.js');
      return dev({ services: values.service ?? [] });
    }
    case 'stack': {
      await import('../deploy/local/stack.js').then(async (m) => {
        const stack = await m.startStack({ log: (s) => process.stderr.write(`${s}\n`) });
        process.stdout.write(`KAFKA_BROKERS=${stack.brokers}\nREDIS_URL=${stack.redisUrl}\n`);
        await new Promise<void>((resolve) => {
          const stop = () => void stack.stop().then(resolve);
          process.once('SIGINT', stop);
          process.once('SIGTERM', stop);
        });
      });
      return 0;
    }
    case 'publish': {
      const { values } = parseArgs({
        args: rest,
        options: {
          input: { type: 'string' },
          topic: { type: 'string' },
          tenant: { type: 'string' },
          agent: { type: 'string' },
        },
      });
      if (!values.input) {
        process.stderr.write('paver publish: --input FILE.jsonl is required\n');
        return 2;
      }
      const { publish } = await import('./publish.js');
      return publish({
        input: values.input,
        ...(values.topic ? { topic: values.topic } : {}),
        ...(values.tenant !== undefined ? { tenant: values.tenant } : {}),
        ...(values.agent !== undefined ? { agent: values.agent } : {}),
      });
    }
    case 'gen-schemas': {
      await import('../schemas/generate.js').then((m) => m.writeSchemas());
      return 0;
    }
    case 'detect': {
      const { detectCommand } = await import('../services/detector/src/cli.js');
      return detectCommand(rest);
    }
    case 'autoseq': {
      const { autoseqCommand } = await import('../services/autoseq/src/cli.js');
      return autoseqCommand(rest);
    }
    case 'predict': {
      const { predictCommand } = await import('../services/autoseq/src/learn-cli.js');
      return predictCommand(rest);
    }
    case 'savings': {
      const { savingsCommand } = await import('../services/autoseq/src/learn-cli.js');
      return savingsCommand(rest);
    }
    case 'sequence': {
      const { sequenceCommand } = await import('../services/sequencer/src/cli.js');
      return sequenceCommand(rest);
    }
    case 'select': {
      const { selectCommand } = await import('../services/flows/src/cli.js');
      return selectCommand(rest);
    }
    case 'otel': {
      const { otelCommand } = await import('../services/ingest/src/cli.js');
      return otelCommand(rest);
    }
    case 'flows': {
      if (rest[0] === 'from-candidates') {
        const { fromCandidatesCommand } = await import('./flows-from-candidates.js');
        return fromCandidatesCommand(rest.slice(1));
      }
      if (rest[0] === 'replay') {
        const { replayCommand } = await import('./flows-replay.js');
        return replayCommand(rest.slice(1));
      }
      const { flowsCommand } = await import('../services/flows/src/cli.js');
      return flowsCommand(rest);
    }
    default:
      process.stderr.write(`paver: unknown command '${cmd}'\n\n${HELP}`);
      return 2;
  }
}
