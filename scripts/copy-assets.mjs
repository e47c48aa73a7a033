// tsc does not copy non-TypeScript files: ship the Lua scripts beside the compiled adapters.
import { cpSync, readdirSync, statSync, mkdirSync } from 'node:fs';
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
for (const r of roots) walk(r);
