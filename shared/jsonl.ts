import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { toolCallsEventV1, TOOL_CALLS_EVENT_TYPES, type ToolCallsEvent } from '../schemas/index.js';
import { zodParser } from './kafka/runner.js';
import { errorMessage } from './errors.js';

const MAX_LINE = 1024 * 1024;
const MAX_WARNINGS = 100;

/**
 * Streams a JSONL file of tool-calls events for the offline commands: a million-event file never sits in
 * memory whole. Bad lines are reported with their line number (the first hundred), skipped and counted.
 */
export async function* readEvents(
  path: string,
  stats: { lines: number; bad: number },
  warn: (s: string) => void,
): AsyncGenerator<ToolCallsEvent> {
  const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
  const rl = createInterface({ input: createReadStream(path), crlfDelay: Infinity });
  for await (const line of rl) {
    stats.lines++;
    if (!line.trim()) continue;
    const fail = (why: string) => {
      stats.bad++;
      if (stats.bad <= MAX_WARNINGS) warn(`line ${stats.lines}: ${why}`);
    };
    if (line.length > MAX_LINE) {
      fail(`longer than ${MAX_LINE} characters`);
      continue;
    }
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch {
      fail('not valid JSON');
      continue;
    }
    const r = parse(raw, 'file');
    if (!r.ok) {
      fail(`${r.reason}: ${r.detail}`);
      continue;
    }
    yield r.value;
  }
  if (stats.bad > MAX_WARNINGS) warn(`… ${stats.bad - MAX_WARNINGS} more bad lines`);
}

/** Reads a JSON or YAML configuration file (by extension; JSON is tried first otherwise). */
export async function readConfigFile(path: string): Promise<unknown> {
  const { readFile } = await import('node:fs/promises');
  const text = await readFile(path, 'utf8');
  if (/\.ya?ml$/i.test(path)) return (await import('yaml')).parse(text);
  try {
    return JSON.parse(text);
  } catch (err) {
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
