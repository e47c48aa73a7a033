import type { z } from 'zod';
import { PaverError, errorMessage } from '../../../../shared/errors.js';
import { describeIssues, readConfigFile } from '../../../../shared/jsonl.js';

/** A configuration file (JSON or YAML) read and checked against `schema`; `what` names it (its variable) in errors. */
export async function loadFile<T>(path: string, schema: z.ZodType<T>, what: string): Promise<T> {
  let raw: unknown;
  try {
    raw = await readConfigFile(path);
  } catch (err) {
    throw new PaverError('CONFIG_INVALID', `${what}: cannot read ${path}: ${errorMessage(err)}`);
  }
  const r = schema.safeParse(raw);
  if (!r.success)
    throw new PaverError('CONFIG_INVALID', `${what} ${path}: ${describeIssues(r.error.issues)}`);
  return r.data;
}
