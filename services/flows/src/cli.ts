import { joinValues, numberFlag, parseFlags } from '../../../shared/flags.js';
import { parseArgs } from 'node:util';
import { flowsFileV1 } from '../../../schemas/index.js';
import { describeIssues, readConfigFile } from '../../../shared/jsonl.js';
import { fillVectors, select } from './adapters/selector.js';
import { PromptCache } from './core/prompt.js';
import { FlowRegistry, registerManual } from './core/registry.js';
import { OutcomeBook } from './core/outcomes.js';
import { offlineEnv, policies, readPolicyFile, type FlowsEnv, type PolicyFile } from './config.js';
import { errorMessage } from '../../../shared/errors.js';
import { cutText } from '../../../shared/core/text.js';

const SELECT_USAGE = `Usage: paver select --flows FILE.(json|yaml) --query TEXT [--summary TEXT ...] [--top-k 3] [--rrf-k 10]
                    [--fail-open] [--score-floor X] [--outcome-floor X] [--pretty]

Defaults are the service's (FLOWS_TOP_K, FLOWS_RRF_K, FLOWS_SCORE_FLOOR, FLOWS_FAIL_OPEN, FLOWS_OUTCOME_* from the
environment, at their service defaults when unset, and FLOWS_POLICY_FILE's entry for --tenant/--agent); a flag wins.

Runs flow selection offline over a flows file (a JSON/YAML array of flows) and prints the result as one JSON line (--pretty indents it).
With FLOWS_CHAT_URL (and FLOWS_CHAT_API_KEY, FLOWS_CHAT_MODEL) set, several candidates go to that
OpenAI-compatible chat endpoint; without it, the top-ranked candidate is chosen. With FLOWS_EMBEDDINGS_URL
(and FLOWS_EMBEDDINGS_API_KEY, FLOWS_EMBEDDINGS_MODEL), recall is also dense, as in the service. When the file is
{flows, past_runs} (\`paver flows from-candidates --history\`), the flows are also ranked by how well their
steps matched the past runs with the most similar first requests; one not above --outcome-floor (default 0)
on such evidence is not chosen.
`;

export async function selectCommand(argv: string[]): Promise<number> {
  const values = parseFlags('select', SELECT_USAGE, argv, {
    flows: { type: 'string' },
    query: { type: 'string' },
    summary: { type: 'string', multiple: true },
    'top-k': { type: 'string' },
    'rrf-k': { type: 'string' },
    'score-floor': { type: 'string' },
    'outcome-floor': { type: 'string' },
    'fail-open': { type: 'boolean' },
    pretty: { type: 'boolean' },
    tenant: { type: 'string' },
    agent: { type: 'string' },
    help: { type: 'boolean' },
  });
  if (typeof values === 'number') return values;
  if (!values.flows || !values.query) {
    process.stderr.write(`paver select: --flows and --query are required\n\n${SELECT_USAGE}`);
    return 2;
  }
  let settings: FlowsEnv;
  let overrides: PolicyFile;
  try {
    settings = offlineEnv(process.env);
    overrides = await readPolicyFile(settings);
  } catch (err) {
    process.stderr.write(`paver select: FLOWS_* settings: ${errorMessage(err)}\n`);
    return 2;
  }
  const pol = policies(settings, overrides);
  let policy;
  try {
    // The service's selection settings (FLOWS_* as the service reads them), then the flags.
    const base = pol.select(values.tenant ?? 'default', values.agent ?? 'default');
    policy = {
      ...base,
      // The ranges of FLOWS_TOP_K, FLOWS_RRF_K, FLOWS_SCORE_FLOOR and FLOWS_OUTCOME_FLOOR.
      topK: numberFlag('top-k', values['top-k'], base.topK, { min: 1, max: 100, integer: true }),
      rrfK: numberFlag('rrf-k', values['rrf-k'], base.rrfK, { min: 1, max: 1000, integer: true }),
      scoreFloor: numberFlag('score-floor', values['score-floor'], base.scoreFloor, { min: 0 }),
      failOpen: values['fail-open'] ? true : base.failOpen,
      outcomeFloor: numberFlag('outcome-floor', values['outcome-floor'], base.outcomeFloor, {
        min: -Infinity,
      }),
    };
  } catch (err) {
    process.stderr.write(`paver select: ${errorMessage(err)}\n`);
    return 2;
  }
  let raw: unknown;
  try {
    raw = await readConfigFile(values.flows);
  } catch (err) {
    process.stderr.write(`paver select: cannot read ${values.flows}: ${errorMessage(err)}\n`);
    return 2;
  }
  const parsed = flowsFileV1.safeParse(raw);
  if (!parsed.success) {
    process.stderr.write(`paver select: ${values.flows}: ${describeIssues(parsed.error.issues)}\n`);
    return 2;
  }
  const tenant = values.tenant ?? 'default';
  const agent = values.agent ?? 'default';
  const registry = new FlowRegistry();
  // Offline, every flow in the file is in the one scope asked about.
  for (const d of Array.isArray(parsed.data) ? parsed.data : parsed.data.flows)
    registry.upsert(registerManual({ ...d, tenant_id: tenant, agent_id: agent }, 0));
  // Past runs in the file rank flows by past outcomes, as the service's memory does.
  const outcomes = new OutcomeBook(pol.outcome());
  for (const run of Array.isArray(parsed.data) ? [] : (parsed.data.past_runs ?? []))
    outcomes.add(tenant, agent, run);
  const chat = settings.FLOWS_CHAT_URL
    ? {
        baseUrl: settings.FLOWS_CHAT_URL,
        apiKey: settings.FLOWS_CHAT_API_KEY,
        model: settings.FLOWS_CHAT_MODEL,
      }
    : undefined;
  // Dense recall as the service does it (FLOWS_EMBEDDINGS_URL): the flows' vectors, then the request's. Offline
  // selection without it ranked on sparse recall alone and could choose another flow than the service.
  const embeddings = settings.FLOWS_EMBEDDINGS_URL
    ? {
        baseUrl: settings.FLOWS_EMBEDDINGS_URL,
        apiKey: settings.FLOWS_EMBEDDINGS_API_KEY,
        model: settings.FLOWS_EMBEDDINGS_MODEL,
      }
    : undefined;
  if (embeddings)
    await fillVectors(registry, embeddings, settings.FLOWS_SELECT_BUDGET_MS * 5).catch((err: unknown) =>
      process.stderr.write(
        `paver select: flow embeddings failed (${errorMessage(err)}); sparse recall only\n`,
      ),
    );
  const result = await select(
    {
      registry,
      prompts: new PromptCache(),
      chat,
      embeddings,
      budgetMs: settings.FLOWS_SELECT_BUDGET_MS,
      outcomes,
    },
    tenant,
    agent,
    values.query,
    values.summary ?? [],
    policy,
  );
  process.stdout.write(JSON.stringify(result, null, values.pretty ? 2 : undefined) + '\n');
  return 0;
}

/** Characters of an HTTP error answer said on stderr; bytes of it read (the rest is not waited for). */
const ERROR_SHOWN = 500;
const ERROR_READ = 64 * 1024;

/**
 * An HTTP error answer as one stderr line: the service's JSON `error` when it is one, else the body, on one line
 * and cut at ERROR_SHOWN characters. The whole body went to stderr before: a proxy's or another server's page
 * of HTML (the wrong --url) filled the terminal, and its control characters reached it.
 */
async function httpErrorLine(res: Response): Promise<string> {
  let bytes = Buffer.alloc(0);
  let more = false;
  if (res.body) {
    const reader = res.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      bytes = Buffer.concat([bytes, value]);
      if (bytes.length > ERROR_READ) {
        more = true;
        await reader.cancel().catch(() => undefined);
        break;
      }
    }
  }
  const body = bytes.subarray(0, ERROR_READ).toString('utf8');
  let text = body;
  try {
    const parsed = JSON.parse(body) as unknown;
    if (
      parsed !== null &&
      typeof parsed === 'object' &&
      typeof (parsed as { error?: unknown }).error === 'string'
    )
      text = (parsed as { error: string }).error;
  } catch {
    // Not the service's JSON: the body itself.
  }
  return oneLine(text, more ? null : undefined);
}

/**
 * `text` on one line (control characters and runs of space made one space), cut at ERROR_SHOWN characters.
 * `whole`: the answer's length to say at a cut (null: over ERROR_READ bytes; undefined: the text's own).
 */
function oneLine(text: string, whole?: number | null): string {
  // eslint-disable-next-line no-control-regex
  const line = text.replace(/[\s\u0000-\u001f\u007f-\u009f]+/g, ' ').trim();
  if (line.length > ERROR_SHOWN || whole === null) {
    const all = whole === null ? `over ${ERROR_READ} bytes` : `${whole ?? line.length} characters`;
    // Not half of a surrogate pair at the cut.
    return `${cutText(line, ERROR_SHOWN)}… (cut; ${all} in all)`;
  }
  return line || '(no body)';
}

const FLOWS_USAGE = `Usage: paver flows list [--status pending|promoted|rejected|retracted]
       paver flows show KEY
       paver flows promote KEY
       paver flows reject KEY
       paver flows registry
  options: --url URL (default $FLOWS_URL or http://127.0.0.1:9104)  --tenant T  --agent A  --pretty

Talks to a running flows service over HTTP (GET /flows/candidates, POST /flows/candidates/{key}/promote|reject).
`;

/**
 * `path` (with its query) under the base URL's own path: a flows service behind a gateway at
 * `https://gw/paver-flows` is asked `https://gw/paver-flows/flows?…`. `new URL(path, base)` with an absolute path
 * dropped the base's path, and the gateway was asked for `/flows`.
 */
export function underBase(base: string, path: string): URL {
  const url = new URL(base);
  const [pathname, query = ''] = path.split('?', 2) as [string, string?];
  url.pathname = url.pathname.replace(/\/+$/, '') + pathname;
  url.search = query;
  url.hash = '';
  return url;
}

export async function flowsCommand(argv: string[]): Promise<number> {
  const options = {
    url: { type: 'string' },
    tenant: { type: 'string' },
    agent: { type: 'string' },
    status: { type: 'string' },
    pretty: { type: 'boolean' },
    help: { type: 'boolean' },
  } as const;
  let parsed;
  try {
    parsed = parseArgs({ args: joinValues(argv, options), allowPositionals: true, options });
  } catch (err) {
    process.stderr.write(`paver flows: ${errorMessage(err)}\n\n${FLOWS_USAGE}`);
    return 2;
  }
  const { values, positionals } = parsed;
  const [verb, key] = positionals;
  if (values.help || !verb) {
    process.stdout.write(FLOWS_USAGE);
    return values.help ? 0 : 2;
  }
  const base = values.url ?? process.env.FLOWS_URL ?? 'http://127.0.0.1:9104';
  const q = new URLSearchParams({
    tenant_id: values.tenant ?? 'default',
    agent_id: values.agent ?? 'default',
    ...(values.status ? { status: values.status } : {}),
  });
  const needKey = ['show', 'promote', 'reject'].includes(verb);
  if (needKey && !key) {
    process.stderr.write(`paver flows ${verb}: KEY (a candidate's dedupe_key) is required\n`);
    return 2;
  }
  const path =
    verb === 'list'
      ? `/flows/candidates?${q}`
      : verb === 'registry'
        ? `/flows?${q}`
        : verb === 'show'
          ? `/flows/candidates/${encodeURIComponent(key!)}?${q}`
          : verb === 'promote' || verb === 'reject'
            ? `/flows/candidates/${encodeURIComponent(key!)}/${verb}?${q}`
            : null;
  if (!path) {
    process.stderr.write(`paver flows: unknown subcommand '${verb}'\n\n${FLOWS_USAGE}`);
    return 2;
  }
  let target: URL;
  try {
    target = underBase(base, path);
  } catch {
    process.stderr.write(`paver flows: --url (or FLOWS_URL) is not a URL: ${cutText(base, 200)}\n`);
    return 2;
  }
  let res: Response;
  try {
    res = await fetch(target, {
      method: verb === 'promote' || verb === 'reject' ? 'POST' : 'GET',
    });
  } catch (err) {
    process.stderr.write(
      `paver flows: cannot reach the flows service at ${base} (${errorMessage(err)}); is it running? (npm start)\n`,
    );
    return 1;
  }
  if (!res.ok) {
    process.stderr.write(`paver flows ${verb}: HTTP ${res.status}: ${await httpErrorLine(res)}\n`);
    return 1;
  }
  const text = await res.text();
  let answer: unknown;
  try {
    answer = JSON.parse(text);
  } catch {
    // Another server at --url (a proxy's page, a different service): before, a SyntaxError's stack trace.
    process.stderr.write(
      `paver flows ${verb}: the answer from ${base} is not JSON (is it the flows service?): ${oneLine(text)}\n`,
    );
    return 1;
  }
  process.stdout.write(JSON.stringify(answer, null, values.pretty ? 2 : undefined) + '\n');
  return 0;
}
