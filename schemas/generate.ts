import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { CONTRACTS } from './index.js';

/** JSON Schema text for one contract: deterministic, so a stale checked-in file is a plain diff. */
export function jsonSchemaFor(name: string): string {
  const c = CONTRACTS[name];
  if (!c) throw new Error(`unknown contract ${name}`);
  const js = z.toJSONSchema(c.schema, { io: c.io, target: 'draft-7', unrepresentable: 'any' });
  return (
    JSON.stringify(
      { $id: `https://paver.dev/schemas/${name}.json`, title: `paver.${name}`, ...js },
      null,
      2,
    ) + '\n'
  );
}

export function schemaDir(): string {
  // Works from schemas/ (vitest) and dist/schemas/ (compiled): the JSON lives in the source tree.
  const here = dirname(fileURLToPath(import.meta.url));
  return here.includes(`${join('dist', 'schemas')}`)
    ? join(here, '..', '..', 'schemas', 'json')
    : join(here, 'json');
}

export function staleSchemas(): string[] {
  return Object.keys(CONTRACTS).filter((name) => {
    try {
      return readFileSync(join(schemaDir(), `${name}.schema.json`), 'utf8') !== jsonSchemaFor(name);
    } catch {
      return true;
    }
  });
}

export function writeSchemas(): void {
  mkdirSync(schemaDir(), { recursive: true });
  for (const name of Object.keys(CONTRACTS)) {
    writeFileSync(join(schemaDir(), `${name}.schema.json`), jsonSchemaFor(name));
    process.stdout.write(`wrote schemas/json/${name}.schema.json\n`);
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) writeSchemas();
