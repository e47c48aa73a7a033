import { own, setOwn } from './core/own.js';
import type { z } from 'zod';
import { createReadStream } from 'node:fs';
import { once } from 'node:events';
import type { Readable } from 'node:stream';
import {
  id,
  taskCompletedEvent,
  toolCallEvent,
  toolCallsEventV1,
  userMessageEvent,
  TOOL_CALLS_EVENT_TYPES,
  type ToolCallsEvent,
} from '../schemas/index.js';
import { zodParser } from './kafka/runner.js';
import { errorMessage } from './errors.js';
import { deeperThan, PAYLOAD_DEPTH, TOO_DEEP } from './core/json-depth.js';
import { MAX_WHOLE_INPUT_BYTES, maxConfigBytes } from './config.js';

const MAX_LINE = 1024 * 1024;
const MAX_WARNINGS = 100;
/** Bounds the memory an adversarial file with ever-new field names can take. */
const MAX_UNKNOWN_NAMES = 50;

/** Fields each event type knows; anything else in an input line is counted as unknown (zod strips it). */
const KNOWN_FIELDS: Record<string, ReadonlySet<string>> = {
  tool_call: new Set(Object.keys(toolCallEvent.shape)),
  task_completed: new Set(Object.keys(taskCompletedEvent.shape)),
  user_message: new Set(Object.keys(userMessageEvent.shape)),
};
/**
 * Short names people write for the scope fields. Read as the real field when that one is absent, because
 * dropping them silently merges every agent of a file into the 'default' scope.
 */
const ALIASES: Readonly<Record<string, string>> = { agent: 'agent_id', tenant: 'tenant_id' };
/**
 * Fields each event type may leave out and that take no null: a null there is read as absent. Exporters in
 * Python write a missing value as `null` (`"agent_id": null`, `"args": null` for a call without arguments), and
 * refusing the line lost the call; on a field present on every line it lost the whole file.
 */
const NULL_AS_ABSENT: Record<string, ReadonlySet<string>> = Object.fromEntries(
  Object.entries({
    tool_call: toolCallEvent,
    task_completed: taskCompletedEvent,
    user_message: userMessageEvent,
  }).map(([type, schema]) => [
    type,
    new Set(
      Object.entries(schema.shape as Record<string, z.ZodType>)
        .filter(([, f]) => f.safeParse(undefined).success && !f.safeParse(null).success)
        .map(([k]) => k),
    ),
  ]),
);

/**
 * JSON.parse, and failing that the same text with bare `NaN`, `Infinity` and `-Infinity` (what Python's
 * json.dumps writes for such floats by default) read as null; undefined when the line is not JSON either way.
 * Refused, such a line gave no output line at all, since nothing of it was read.
 */
export function parseJsonLine(line: string): { value: unknown; nonFinite: boolean } | undefined {
  try {
    return { value: JSON.parse(line) as unknown, nonFinite: false };
  } catch {
    if (!/NaN|Infinity/.test(line)) return undefined;
  }
  // Outside strings only: a tool's output may well say "NaN".
  let out = '';
  let from = 0;
  let inString = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') {
      inString = true;
      continue;
    }
    for (const token of ['-Infinity', 'Infinity', 'NaN'])
      if (line.startsWith(token, i)) {
        out += line.slice(from, i) + 'null';
        i += token.length - 1;
        from = i + 1;
        break;
      }
  }
  try {
    return { value: JSON.parse(out + line.slice(from)) as unknown, nonFinite: true };
  } catch {
    return undefined;
  }
}

/** A value's `type`, `event_id`, `session_id` and `task_id` where they are strings (nothing else of it). */
function topStrings(v: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return out;
  for (const k of ['type', 'event_id', 'session_id', 'task_id']) {
    const x = own(v as Record<string, unknown>, k);
    if (typeof x === 'string') out[k] = x;
  }
  return out;
}

/**
 * The first `type`, `event_id`, `session_id` and `task_id` string fields written in a line's head, for a line
 * too long to parse or cut short: enough to answer it (`{ type }` alone is returned without them).
 */
function headFields(head: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of ['type', 'event_id', 'session_id', 'task_id']) {
    const m = new RegExp(`"${k}"\\s*:\\s*("(?:[^"\\\\]|\\\\.)*")`).exec(head);
    if (!m) continue;
    try {
      out[k] = JSON.parse(m[1]!) as string;
    } catch {
      // Not a JSON string after all: left out.
    }
  }
  return out;
}

/** An ISO 8601 date-time, as exporters write `ts` when they do not write epoch milliseconds. */
const ISO_TIME = /^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}/;

export interface ReadStats {
  lines: number;
  bad: number;
  /** Unknown top-level field name → lines that carried it (optional so existing callers need not pass it). */
  unknown?: Record<string, number>;
}

/**
 * What every readEvents call of this process has read, for the CLI's `--strict` and its end-of-run
 * summary: the commands keep their own stats, and the CLI reads this one without knowing their internals.
 */
export const inputTally = { lines: 0, bad: 0 };
export function resetInputTally(): void {
  inputTally.lines = 0;
  inputTally.bad = 0;
}

/** `-` is stdin, as for every Unix tool; anything else is a file path. */
export const openInput = (path: string): Readable => (path === '-' ? process.stdin : createReadStream(path));

/** What boundedLines keeps of a line too long to read: its first characters (up to LONG_LINE_HEAD). */
export interface LongLineHead {
  head: string;
}
const LONG_LINE_HEAD = 64 * 1024;

/**
 * The lines of a stream (split at `\n`, a `\r` before it dropped), each as text, or `null` for a line longer
 * than `maxChars` characters (its first characters then in `long.head`, when given). A long line is dropped as
 * it streams by: readline would hold it whole before its length could be checked, and a file with one endless
 * line ran the process out of memory.
 */
export async function* boundedLines(
  input: AsyncIterable<unknown>,
  maxChars: number,
  long?: LongLineHead,
): AsyncGenerator<string | null> {
  // A UTF-16 character takes at most 3 UTF-8 bytes: a line of more bytes than this is too long whatever it holds.
  const maxBytes = 3 * maxChars + 1;
  let parts: Buffer[] = [];
  let size = 0;
  let tooLong = false;
  const take = (): string | null => {
    const text = tooLong ? null : Buffer.concat(parts, size).toString('utf8');
    parts = [];
    size = 0;
    tooLong = false;
    if (text === null) return null;
    const line = text.endsWith('\r') ? text.slice(0, -1) : text;
    if (line.length <= maxChars) return line;
    if (long) long.head = line.slice(0, LONG_LINE_HEAD);
    return null;
  };
  for await (const chunk of input) {
    const buf = typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer);
    let start = 0;
    for (;;) {
      const nl = buf.indexOf(0x0a, start);
      const end = nl < 0 ? buf.length : nl;
      if (!tooLong && end > start) {
        if (size + end - start > maxBytes) {
          if (long)
            long.head = Buffer.concat([
              ...parts,
              buf.subarray(start, Math.min(end, start + 3 * LONG_LINE_HEAD)),
            ])
              .toString('utf8')
              .slice(0, LONG_LINE_HEAD);
          tooLong = true;
          parts = [];
          size = 0;
        } else {
          parts.push(buf.subarray(start, end));
          size += end - start;
        }
      }
      if (nl < 0) break;
      yield take();
      start = nl + 1;
    }
  }
  if (tooLong || size > 0) yield take();
}

/**
 * Streams a JSONL file of tool-calls events for the offline commands: a million-event file never sits in
 * memory whole. Bad lines are reported with their line number (the first hundred), skipped and counted.
 * Unknown fields are counted per name and reported once at the end; `agent`/`tenant` are read as
 * `agent_id`/`tenant_id` with a one-time note.
 */
export async function* readEvents(
  path: string,
  stats: ReadStats,
  warn: (s: string) => void,
  /** Called with each bad line that was JSON, or whose head names its type (after it is counted and reported), in input order. */
  onBad?: (raw: unknown) => void,
): AsyncGenerator<ToolCallsEvent> {
  const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
  const unknown: Record<string, number> = (stats.unknown ??= {});
  // What a file does the same way on every line is said once, at its first line.
  const noted = new Set<string>();
  const once = (key: string, s: string) => {
    if (noted.has(key)) return;
    noted.add(key);
    warn(s);
  };
  const noteOnce = (key: string, s: string) => once(key, `${s} (noted once)`);
  const long: LongLineHead = { head: '' };
  for await (const line of boundedLines(openInput(path), MAX_LINE, long)) {
    stats.lines++;
    inputTally.lines++;
    const fail = (why: string) => {
      stats.bad++;
      inputTally.bad++;
      if (stats.bad <= MAX_WARNINGS) warn(`line ${stats.lines}: ${why}`);
    };
    if (line === null) {
      // Still one output line per tool_call for the commands that print one (`paver predict`): the head of
      // the line (a huge observation comes after the ids in exports) says whether it was one, and its ids.
      const head = headFields(long.head);
      long.head = '';
      fail(`longer than ${MAX_LINE} characters${head.type ? ` (a ${head.type} event, not read)` : ''}`);
      if (head.type) onBad?.(head);
      continue;
    }
    // A byte order mark (written by some Windows tools) made the first line invalid JSON, and it was lost.
    const text = stats.lines === 1 && line.charCodeAt(0) === 0xfeff ? line.slice(1) : line;
    if (!text.trim()) continue;
    const parsed = parseJsonLine(text);
    if (!parsed) {
      fail('not valid JSON');
      // A line cut short (a writer killed mid-line) may still name a tool_call in its head: as for a line too
      // long to read, its ids, so that `paver predict` keeps one output line per input call.
      const head = headFields(text);
      if (head.type) onBad?.(head);
      continue;
    }
    if (deeperThan(parsed.value)) {
      fail(TOO_DEEP);
      // Its ids only, as for a line too long to read: still one output line per tool_call where one is printed.
      const ids = topStrings(parsed.value);
      if (ids.type) onBad?.(ids);
      continue;
    }
    const raw = parsed.value;
    if (parsed.nonFinite) noteOnce('nonFinite', `line ${stats.lines}: NaN/Infinity read as null`);
    if (raw !== null && typeof raw === 'object' && !Array.isArray(raw)) {
      const obj = raw as Record<string, unknown>;
      const type = typeof obj.type === 'string' ? obj.type : '';
      const nullable = own(NULL_AS_ABSENT, type);
      if (nullable)
        for (const k of Object.keys(obj))
          if (obj[k] === null && nullable.has(k)) {
            delete obj[k];
            noteOnce(`null:${k}`, `line ${stats.lines}: '${k}': null read as absent`);
          }
      // Tool-calling APIs carry a call's arguments as JSON text (OpenAI's function.arguments): read the object.
      if (type === 'tool_call' && typeof obj.args === 'string') {
        const args = parseJsonLine(obj.args)?.value;
        if (deeperThan(args, PAYLOAD_DEPTH)) {
          fail(`args ${TOO_DEEP}`);
          onBad?.(topStrings(obj));
          continue;
        }
        if (args !== null && typeof args === 'object' && !Array.isArray(args)) {
          obj.args = args;
          noteOnce('args', `line ${stats.lines}: 'args' given as JSON text: read as the object it holds`);
        }
      }
      // An export with sessions and no tasks (one run, one session): a call or an end of task without a task_id
      // is of the session's task; refused, every line of such a file was lost. A user message without one stays
      // the session's, as the contract says: whether a file has tasks cannot be known from the lines read so far,
      // and the sequencer reads session messages as such.
      if (obj.task_id === null) delete obj.task_id;
      if (
        typeof obj.task_id !== 'string' &&
        typeof obj.session_id === 'string' &&
        (type === 'tool_call' || type === 'task_completed')
      ) {
        obj.task_id = obj.session_id;
        noteOnce('task_id', `line ${stats.lines}: no 'task_id': the session_id is read as the task`);
      }
      // ts labels rules and orders nothing: a float (Python's time.time()) or an ISO date-time is read as
      // epoch milliseconds rather than refusing every line of the file.
      if (typeof obj.ts === 'number' && Number.isFinite(obj.ts) && obj.ts >= 0 && !Number.isInteger(obj.ts)) {
        obj.ts = Math.floor(obj.ts);
        noteOnce('ts', `line ${stats.lines}: 'ts' not an integer: read as its integer part`);
      } else if (typeof obj.ts === 'string' && ISO_TIME.test(obj.ts) && Number.isFinite(Date.parse(obj.ts))) {
        obj.ts = Date.parse(obj.ts);
        noteOnce('tsIso', `line ${stats.lines}: 'ts' as a date-time: read as epoch milliseconds`);
      }
      for (const [alias, field] of Object.entries(ALIASES)) {
        if (!Object.hasOwn(obj, alias) || Object.hasOwn(obj, field)) continue;
        // `"agent": null` (as exported benchmark runs write it) means "not given": the default applies.
        if (obj[alias] === null) {
          delete obj[alias];
          continue;
        }
        // Only a value that can be an id is read as one: exported runs use these names for other things too
        // (an object describing the agent, a long label). Such a value is an unknown field like any other,
        // ignored, not a reason to refuse every line of the file.
        if (!id.safeParse(obj[alias]).success) {
          once(
            `alias:${alias}`,
            `line ${stats.lines}: field '${alias}' is not an id: ignored (write '${field}')`,
          );
          continue;
        }
        obj[field] = obj[alias];
        delete obj[alias];
        once(
          `alias:${alias}`,
          `line ${stats.lines}: field '${alias}' read as '${field}' (write '${field}'; noted once)`,
        );
      }
      // `type` and field names are the line's: own properties only (a type `constructor` is no contract).
      const known = typeof obj.type === 'string' ? own(KNOWN_FIELDS, obj.type) : undefined;
      if (known)
        for (const k of Object.keys(obj)) {
          if (known.has(k)) continue;
          if (Object.hasOwn(unknown, k)) unknown[k]!++;
          else if (Object.keys(unknown).length < MAX_UNKNOWN_NAMES) setOwn(unknown, k, 1);
        }
    }
    const r = parse(raw, 'file');
    if (!r.ok) {
      fail(`${r.reason}: ${r.detail}`);
      onBad?.(raw);
      continue;
    }
    yield r.value;
  }
  if (stats.bad > MAX_WARNINGS) warn(`… ${stats.bad - MAX_WARNINGS} more bad lines`);
  // Field names only, never values: once per name, with how many lines carried it.
  const names = Object.keys(unknown);
  if (names.length > 0)
    warn(
      `unknown fields ignored: ${names.map((n) => `'${n.slice(0, 64)}' on ${unknown[n]} line(s)`).join(', ')}` +
        (names.length >= MAX_UNKNOWN_NAMES ? ' (more names not listed)' : ''),
    );
}

/** An input over its size limit; the message names the limit and what raises it. */
export class InputTooLargeError extends Error {
  constructor(what: string, maxBytes: number, raise: string) {
    super(`${what} is larger than ${maxBytes} bytes, the limit (raise it with ${raise})`);
    this.name = 'InputTooLargeError';
  }
}

/**
 * Exit code of an offline command given a file it cannot read (missing, a directory, no permission, over its
 * size limit), input and configuration file alike: like a usage error, the command line is what to fix. An
 * unreadable --input exited 1 (as a failed run) while an unreadable --catalog exited 2.
 */
export const EXIT_UNREADABLE = 2;

/**
 * What an offline command says, and exits with, when its run over an input file failed: "cannot read" (exit
 * EXIT_UNREADABLE) only when reading did (a missing or unreadable file, an input over its limit); anything else
 * failed on what was read (exit 1), and saying "cannot read" would send the user looking at a file that is fine.
 */
export function inputFailure(cmd: string, path: string, err: unknown): { line: string; code: number } {
  const read =
    err instanceof InputTooLargeError ||
    (err instanceof Error && typeof (err as NodeJS.ErrnoException).syscall === 'string');
  return read
    ? { line: `paver ${cmd}: cannot read ${path}: ${errorMessage(err)}\n`, code: EXIT_UNREADABLE }
    : {
        line: `paver ${cmd}: failed on ${path} (a defect in paver; please report it): ${errorMessage(err)}\n`,
        code: 1,
      };
}

/**
 * A file, or stdin for `-`, read whole but never past `maxBytes`: counted as it streams, since stdin, a pipe or
 * a device has no size to look at first, and a file may grow while it is read. Stops reading at the limit.
 */
export async function readBounded(path: string, maxBytes: number, raise: string): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  // Leaving the loop by the throw destroys the stream: a file's descriptor is freed, nothing more is read.
  for await (const c of openInput(path)) {
    const buf = typeof c === 'string' ? Buffer.from(c) : (c as Buffer);
    size += buf.length;
    if (size > maxBytes) throw new InputTooLargeError(path === '-' ? 'stdin' : path, maxBytes, raise);
    chunks.push(buf);
  }
  return Buffer.concat(chunks, size).toString('utf8');
}

/** PAVER_MAX_CONFIG_BYTES from `env`, or its default; a bad value is an error that names the variable. */
export function configByteLimit(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.PAVER_MAX_CONFIG_BYTES;
  const r = maxConfigBytes.safeParse(raw === '' ? undefined : raw);
  if (!r.success)
    throw new Error(`PAVER_MAX_CONFIG_BYTES: expected an integer from 1024 to ${MAX_WHOLE_INPUT_BYTES}`);
  return r.data;
}

/** JSON lines (`paver detect`'s default output) as an array; undefined when some line is not JSON. */
function parseJsonLines(text: string): unknown[] | undefined {
  const out: unknown[] = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    try {
      out.push(JSON.parse(line));
    } catch {
      return undefined;
    }
  }
  return out;
}

/**
 * Reads a JSON or YAML configuration file (by extension; JSON is tried first otherwise). JSON lines are
 * read as an array, so a command's JSONL output can be the next one's input file; `-` reads stdin. Larger
 * than `maxBytes` (PAVER_MAX_CONFIG_BYTES, 64 MiB by default) it is refused before it fills the memory.
 */
export async function readConfigFile(path: string, maxBytes = configByteLimit()): Promise<unknown> {
  const text = await readBounded(path, maxBytes, 'PAVER_MAX_CONFIG_BYTES');
  // Read as JSON lines, an empty file was an empty array: a catalog was refused as 'expected object, received
  // array', and `paver detect … > c.json` that failed left a c.json that `flows from-candidates` and `select`
  // took for "no flows" (exit 0). A YAML file was refused as null. An empty file is a mistake: say so.
  if (!text.trim()) throw new Error(`${path === '-' ? 'stdin' : path} is empty`);
  if (/\.ya?ml$/i.test(path)) return (await import('yaml')).parse(text);
  try {
    return JSON.parse(text);
  } catch (err) {
    const lines = parseJsonLines(text);
    if (lines) return lines;
    if (/\.json$/i.test(path)) throw new Error(`${path} is not valid JSON: ${errorMessage(err)}`);
    return (await import('yaml')).parse(text);
  }
}

/** One line of zod issues, paths included, values never (they may be payload). */
export function describeIssues(
  issues: readonly { path: PropertyKey[]; message: string }[],
  max = 10,
): string {
  return issues
    .slice(0, max)
    .map((i) => `${i.path.map(String).join('.') || '(root)'}: ${i.message}`)
    .join('; ');
}

/**
 * JSON lines to stdout in blocks of a thousand, for the commands that print one line per event. `ready()` is
 * a promise while stdout's buffer is full, for the reading loop to await: a reader slower than the command (a
 * pipe into a slow consumer) otherwise left every line not yet taken in memory, the whole output at worst.
 */
export function stdoutLines() {
  const out: string[] = [];
  let waiting: Promise<void> | undefined;
  const flush = () => {
    if (out.length === 0) return;
    const ok = process.stdout.write(out.join('\n') + '\n');
    out.length = 0;
    if (!ok && !waiting)
      waiting = once(process.stdout, 'drain').then(() => {
        waiting = undefined;
      });
  };
  return {
    push(line: string) {
      out.push(line);
      if (out.length >= 1000) flush();
    },
    flush,
    ready: (): Promise<void> | undefined => waiting,
  };
}
