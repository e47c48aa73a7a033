// tsc does not copy non-TypeScript files: ship the Lua scripts beside the compiled adapters. A script renamed
// or removed in the source is removed from dist too: the loader reads every script of a folder, and a stale
// copy of a renamed one would be registered under the same name.
import { cpSync, existsSync, readdirSync, rmSync, statSync, mkdirSync } from 'node:fs';
import { join, dirname } from 'node:path';

const roots = ['services', 'shared'];
function walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (name === 'node_modules' || name === 'test') continue;
    if (statSync(p).isDirectory()) walk(p);
    else if (p.endsWith('.lua')) {
      const out = join('dist', p);
      mkdirSync(dirname(out), { recursive: true });
      cpSync(p, out);
    }
  }
}
/** Lua files in dist whose source is gone. */
function prune(dir) {
  if (!existsSync(dir)) return;
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) prune(p);
    else if (p.endsWith('.lua') && !existsSync(p.slice('dist/'.length))) rmSync(p);
  }
}
for (const r of roots) prune(join('dist', r));
for (const r of roots) walk(r);
