import { numberFlag, parseFlags } from '../../../shared/flags.js';
import { errorMessage } from '../../../shared/errors.js';
import { MAX_WHOLE_INPUT_BYTES } from '../../../shared/config.js';
import { EXIT_UNREADABLE, readBounded } from '../../../shared/jsonl.js';
import { EXIT_UNWRITABLE, openOutputFile, type OutputFile } from '../../../shared/output.js';
import { id, LIMITS } from '../../../schemas/index.js';
import { DEFAULT_MAP_OPTIONS, mapSpans, type MapOptions } from './core/map.js';
import {
  DEFAULT_DECODE_LIMITS,
  MAX_SPANS_PER_MESSAGE_RANGE,
  OtlpError,
  spansFromRequest,
  type OtlpSpan,
} from './core/otlp.js';

const USAGE = `Usage: paver otel --input FILE|- [--output FILE|-] [--tenant T] [--tenant-attribute KEY]
                  [--no-payloads] [--max-payload-bytes N] [--max-spans-per-message N] [--max-input-bytes N]
                  [--strict] [--pretty]

Maps an OTLP/JSON trace export (one ExportTraceServiceRequest document, or one per line as the Collector's
file exporter writes them) to Paver tool-calls events, one JSON per line: a tool_call per execute_tool span,
in start order within its invoke_agent span, then a task_completed for the agent span. Same mapping as the
ingest service. A summary goes to stderr.

  --input FILE|-            the export file ('-' reads stdin)
  --output FILE|-           where the JSONL goes (default '-', stdout)
  --tenant T                tenant_id when no span carries the tenant attribute (default 'default')
  --tenant-attribute KEY    span or resource attribute holding the tenant (default 'paver.tenant_id')
  --no-payloads             leave gen_ai.tool.call.arguments/result out of the events
  --max-payload-bytes N     leave out an argument or result value larger than N bytes (default 65536, at most 16777216)
  --max-spans-per-message N a request (document or line) with more spans is bad, as the service dead-letters it
                            (default 10000, 1 to 1000000)
  --max-input-bytes N       refuse an export larger than N bytes (default 268435456, 256 MiB; at most 524288000)
  --strict                  exit 1 when any request in the input was bad, or any span malformed
  --pretty                  indent each event (default: one JSON per line)
`;

/**
 * The export is parsed whole (it may be one JSON document), so its size bounds the memory the command takes,
 * several times over once parsed. Stays under V8's largest string (about 512 MiB), which stdin and a file are
 * read into.
 */
export const DEFAULT_MAX_INPUT_BYTES = 256 * 1024 * 1024;

/** Requests of the file: the whole text as one JSON document, else one document per non-empty line. */
export function parseExport(
  text: string,
  warn: (s: string) => void,
  /** INGEST_MAX_SPANS_PER_MESSAGE's default: the service dead-letters a larger request, so the command refuses it too. */
  maxSpans: number = DEFAULT_DECODE_LIMITS.maxSpans,
): { spans: OtlpSpan[]; requests: number; bad: number; invalid: number } {
  const out = { spans: [] as OtlpSpan[], requests: 0, bad: 0, invalid: 0 };
  let warned = 0;
  const take = (raw: unknown, where: string) => {
    try {
      // A loop, not push(...): spread passes each span as an argument, and from about 125,000 of them that
      // overflows the stack (the whole document was then dropped as a bad request).
      const r = spansFromRequest(raw, { ...DEFAULT_DECODE_LIMITS, maxSpans });
      for (const s of r.spans) out.spans.push(s);
      out.requests++;
      // Left out alone, as the service does (paver_ingest_spans_total{outcome="invalid"}): the rest is kept.
      out.invalid += r.invalid;
      if (r.invalid && ++warned <= 100)
        warn(`${where}: ${r.invalid} malformed span(s) left out (${r.invalidDetail ?? ''})`);
    } catch (err) {
      out.bad++;
      // Over the spans bound, the flag that raises it is named: the service refuses such a request too, but an export
      // written as one document of a whole run holds more spans than any one request the Collector sends.
      const why =
        err instanceof OtlpError
          ? err.message + (err.reason === 'oversize' ? ' (raise --max-spans-per-message to map it)' : '')
          : errorMessage(err);
      if (++warned <= 100) warn(`${where}: ${why}`);
    }
  };
  let whole: unknown;
  try {
    whole = JSON.parse(text);
  } catch {
    whole = undefined;
  }
  if (whole !== undefined) {
    take(whole, 'input');
    return out;
  }
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      out.bad++;
      if (++warned <= 100) warn(`line ${i + 1}: not valid JSON`);
      return;
    }
    take(raw, `line ${i + 1}`);
  });
  return out;
}

export async function otelCommand(argv: string[]): Promise<number> {
  const values = parseFlags('otel', USAGE, argv, {
    input: { type: 'string' },
    output: { type: 'string' },
    tenant: { type: 'string' },
    'tenant-attribute': { type: 'string' },
    'no-payloads': { type: 'boolean' },
    'max-payload-bytes': { type: 'string' },
    'max-input-bytes': { type: 'string' },
    'max-spans-per-message': { type: 'string' },
    strict: { type: 'boolean' },
    pretty: { type: 'boolean' },
    help: { type: 'boolean', short: 'h' },
  });
  if (typeof values === 'number') return values;
  if (!values.input) {
    process.stderr.write(`paver otel: --input is required\n\n${USAGE}`);
    return 2;
  }
  let maxPayload: number;
  let maxSpans: number;
  try {
    // INGEST_MAX_PAYLOAD_BYTES's range: the README says the flag matches the service's variable.
    maxPayload = numberFlag(
      'max-payload-bytes',
      values['max-payload-bytes'],
      DEFAULT_MAP_OPTIONS.maxPayloadBytes,
      {
        min: 0,
        max: 16 * 1024 * 1024,
        integer: true,
      },
    );
    maxSpans = numberFlag(
      'max-spans-per-message',
      values['max-spans-per-message'],
      DEFAULT_DECODE_LIMITS.maxSpans,
      { ...MAX_SPANS_PER_MESSAGE_RANGE, integer: true },
    );
  } catch (err) {
    process.stderr.write(`paver otel: ${errorMessage(err)}\n`);
    return 2;
  }
  const maxInput = values['max-input-bytes'] ?? String(DEFAULT_MAX_INPUT_BYTES);
  if (!/^\d{1,9}$/.test(maxInput) || Number(maxInput) < 1 || Number(maxInput) > MAX_WHOLE_INPUT_BYTES) {
    process.stderr.write(
      `paver otel: --max-input-bytes expects an integer from 1 to ${MAX_WHOLE_INPUT_BYTES}\n`,
    );
    return 2;
  }
  // The tenant goes into every event's tenant_id: one that is not an id made every event a bad line for each
  // consumer (`--tenant ''` did). An empty attribute name matches no attribute (INGEST_TENANT_ATTRIBUTE refuses it).
  if (values.tenant !== undefined && !id.safeParse(values.tenant).success) {
    process.stderr.write(
      `paver otel: --tenant must be an id: 1 to ${LIMITS.idLength} printable characters\n`,
    );
    return 2;
  }
  const attr = values['tenant-attribute'];
  if (attr !== undefined && (attr.length < 1 || attr.length > 256)) {
    process.stderr.write(`paver otel: --tenant-attribute must be 1 to 256 characters\n`);
    return 2;
  }
  const opts: MapOptions = {
    defaultTenant: values.tenant ?? DEFAULT_MAP_OPTIONS.defaultTenant,
    tenantAttribute: values['tenant-attribute'] ?? DEFAULT_MAP_OPTIONS.tenantAttribute,
    includePayloads: !values['no-payloads'],
    maxPayloadBytes: maxPayload,
  };
  const warn = (s: string) => process.stderr.write(`paver otel: ${s}\n`);
  const toFile = values.output !== undefined && values.output !== '-';
  // Opened before the export is read: a path that cannot be written (a missing directory, a directory, no
  // permission) is said at once, in one line, with exit 2 as an unreadable input. The events go to a file beside
  // it, put in place once whole: a run that fails leaves the path as it was, never a partial output.
  let file: OutputFile | undefined;
  if (toFile) {
    try {
      file = await openOutputFile(values.output!);
    } catch (err) {
      warn(errorMessage(err));
      return EXIT_UNWRITABLE;
    }
  }
  let text: string;
  try {
    text = await readBounded(values.input, Number(maxInput), '--max-input-bytes');
  } catch (err) {
    await file?.abort();
    warn(`cannot read ${values.input}: ${errorMessage(err)}`);
    return EXIT_UNREADABLE;
  }
  let parsed: ReturnType<typeof parseExport>;
  let r: ReturnType<typeof mapSpans>;
  try {
    parsed = parseExport(text, warn, maxSpans);
    r = mapSpans(parsed.spans, opts);
    const out = file?.stream ?? process.stdout;
    for (const e of r.events) out.write(`${JSON.stringify(e, null, values.pretty ? 2 : undefined)}\n`);
  } catch (err) {
    // A defect, reported as such by the caller: its temporary file goes with it.
    await file?.abort();
    throw err;
  }
  if (file) {
    try {
      await file.commit();
    } catch (err) {
      // A write that failed (a full disk): nothing put in place.
      warn(errorMessage(err));
      return EXIT_UNWRITABLE;
    }
  }
  const omitted = r.notes.length ? `, ${r.notes.length} payload(s) left out` : '';
  const nested = r.stats.nested ? `, ${r.stats.nested} inside another tool call` : '';
  const invalid = parsed.invalid ? `, ${parsed.invalid} malformed span(s) left out` : '';
  warn(
    `${parsed.requests} request(s), ${parsed.bad} bad; ${r.stats.spans} spans → ${r.stats.toolCalls} tool_call, ` +
      `${r.stats.tasks} task_completed; ${r.stats.pending} tool span(s) without their agent span, ` +
      `${r.stats.orphans} outside any invoke_agent span${nested}${omitted}${invalid}`,
  );
  return values.strict && parsed.bad + parsed.invalid > 0 ? 1 : 0;
}
