import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Redis, ChainableCommander } from 'ioredis';
import type { z } from 'zod';
import { PaverError, type ErrorCode } from '../errors.js';

/**
 * A Lua script file `<name>-<numKeys>.lua` (BullMQ's convention), or `<name>-n.lua` for a script whose key
 * count varies per call (`numberOfKeys` null: `invokeScript` passes the count first, as EVALSHA wants it).
 */
export interface ScriptFile {
  name: string;
  numberOfKeys: number | null;
  lua: string;
}

const FILE = /^([a-z][a-zA-Z0-9]*)-(\d+|n)\.lua$/;
/** `--- @include "lib/x.lua"` (BullMQ's convention): the file's text, path relative to the script folder. */
const INCLUDE = /^--- @include "([a-zA-Z0-9_./-]+\.lua)"$/gm;

/** A script's text with its includes inlined (one level: a fragment holds local functions, not includes). */
function withIncludes(dir: string, lua: string): string {
  return lua.replace(INCLUDE, (_, rel: string) => {
    const path = join(dir, rel);
    if (rel.includes('..') || !existsSync(path))
      throw new PaverError('INTERNAL', `Lua include missing: ${path} (was the build run?)`);
    return readFileSync(path, 'utf8');
  });
}

/** Reads every script in a folder; fails fast when the folder or an expected script is missing from the build. */
export function readScripts(dir: string, expected: string[]): ScriptFile[] {
  if (!existsSync(dir))
    throw new PaverError('INTERNAL', `Lua script folder missing: ${dir} (was the build run?)`);
  const files = readdirSync(dir)
    .map((f) => FILE.exec(f))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => ({
      name: m[1]!,
      numberOfKeys: m[2] === 'n' ? null : Number(m[2]),
      lua: withIncludes(dir, readFileSync(join(dir, m[0]), 'utf8')),
    }));
  const names = new Set<string>();
  for (const f of files) {
    if (names.has(f.name))
      throw new PaverError('INTERNAL', `Lua script ${f.name} is defined twice in ${dir} (a stale build?)`);
    names.add(f.name);
  }
  for (const name of expected) {
    if (!files.some((f) => f.name === name))
      throw new PaverError('INTERNAL', `Lua script missing: ${dir}/${name}-N.lua (or -n.lua)`);
  }
  return files;
}

/** ioredis keeps each defined script, with its key count (null when given per call), on the connection. */
type Scripts = { scriptsSet: Record<string, { numberOfKeys: number | null } | undefined> };

/** Registers scripts once per connection; ioredis sends EVALSHA and falls back to EVAL on NOSCRIPT. */
export function defineScripts(redis: Redis, scripts: ScriptFile[]): void {
  for (const s of scripts) {
    if ((redis as unknown as Scripts).scriptsSet[s.name]) continue; // defined already
    if (s.name in redis)
      throw new PaverError(
        'INTERNAL',
        `Lua script name ${s.name} is taken on the Redis client (a command or a property): rename the file`,
      );
    redis.defineCommand(
      s.name,
      s.numberOfKeys === null ? { lua: s.lua } : { numberOfKeys: s.numberOfKeys, lua: s.lua },
    );
  }
}

type ScriptTarget = Redis | ChainableCommander;

/** Queues or runs a defined script by name; arguments are keys then argv, as ioredis expects. */
export function invokeScript(
  target: ScriptTarget,
  name: string,
  keys: string[],
  argv: (string | number)[],
): unknown {
  const fn = (target as unknown as Record<string, (...a: unknown[]) => unknown>)[name];
  if (typeof fn !== 'function') throw new PaverError('INTERNAL', `Lua script ${name} is not registered`);
  // A pipeline or transaction is not the connection: ask the connection it was made from.
  const conn = ((target as unknown as { redis?: Scripts }).redis ?? target) as unknown as Scripts;
  if (conn.scriptsSet[name]?.numberOfKeys === null) return fn.call(target, keys.length, ...keys, ...argv);
  return fn.call(target, ...keys, ...argv);
}

/**
 * Scripts return `{status, ...}` arrays: a negative status is a failure, mapped to an error here, in one place.
 * Everything else is parsed with the caller's zod schema, so a reply shape change fails loudly.
 */
export function parseScriptReply<S extends z.ZodType>(
  script: string,
  reply: unknown,
  schema: S,
  codes: Record<number, { code: ErrorCode; message: string }> = {},
): z.infer<S> {
  if (Array.isArray(reply) && typeof reply[0] === 'number' && reply[0] < 0) {
    const known = codes[reply[0]];
    throw new PaverError(
      known?.code ?? 'REDIS_SCRIPT_FAILED',
      `${script}: ${known?.message ?? `failed with status ${reply[0]}`}${reply[1] ? ` (${String(reply[1])})` : ''}`,
    );
  }
  const parsed = schema.safeParse(reply);
  if (!parsed.success)
    throw new PaverError('REDIS_SCRIPT_FAILED', `${script}: unexpected reply shape: ${parsed.error.message}`);
  return parsed.data;
}
