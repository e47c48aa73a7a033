// Fails when runtime imports form a cycle: with ESM, a cycle makes load order decide behaviour (a
// binding is undefined half-way through it). Type-only imports are erased at build time and ignored.
// A plain script over the TypeScript parser, so the lint gate needs no resolver plugin with native
// bindings.
import { readdirSync, readFileSync, statSync, existsSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';

const root = resolve(dirname(new URL(import.meta.url).pathname), '..');
const ROOTS = ['shared', 'services', 'schemas', 'cli', 'client', 'bench', 'testkit', 'test', 'deploy'];
const SKIP = new Set(['node_modules', 'dist', '.cache']);

function walk(dir, out) {
  for (const name of readdirSync(dir)) {
    if (SKIP.has(name)) continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (p.endsWith('.ts') && !p.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

function runtimeImports(file) {
  const src = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, false);
  const specs = [];
  for (const st of src.statements) {
    if (ts.isImportDeclaration(st)) {
      const c = st.importClause;
      if (c?.isTypeOnly) continue;
      // `import { type A, type B } from` is erased too.
      const named = c?.namedBindings;
      if (c && !c.name && named && ts.isNamedImports(named) && named.elements.every((e) => e.isTypeOnly))
        continue;
      specs.push(st.moduleSpecifier.text);
    } else if (ts.isExportDeclaration(st) && st.moduleSpecifier && !st.isTypeOnly) {
      specs.push(st.moduleSpecifier.text);
    }
  }
  return specs
    .filter((s) => s.startsWith('.'))
    .map((s) => resolve(dirname(file), s.replace(/\.js$/, '.ts')))
    .filter((p) => existsSync(p));
}

const files = ROOTS.filter((r) => existsSync(join(root, r))).flatMap((r) => walk(join(root, r), []));
const graph = new Map(files.map((f) => [f, runtimeImports(f)]));

// Tarjan's strongly connected components; any component with more than one file is a cycle.
let index = 0;
const idx = new Map();
const low = new Map();
const stack = [];
const on = new Set();
const cycles = [];
function strong(v) {
  idx.set(v, index);
  low.set(v, index++);
  stack.push(v);
  on.add(v);
  for (const w of graph.get(v) ?? []) {
    if (!idx.has(w)) {
      strong(w);
      low.set(v, Math.min(low.get(v), low.get(w)));
    } else if (on.has(w)) low.set(v, Math.min(low.get(v), idx.get(w)));
  }
  if (low.get(v) === idx.get(v)) {
    const comp = [];
    let w;
    do {
      w = stack.pop();
      on.delete(w);
      comp.push(w);
    } while (w !== v);
    if (comp.length > 1 || (graph.get(v) ?? []).includes(v)) cycles.push(comp);
  }
}
for (const f of files) if (!idx.has(f)) strong(f);

if (cycles.length) {
  for (const c of cycles)
    process.stderr.write(`import cycle: ${c.map((f) => relative(root, f)).join(' <-> ')}\n`);
  process.exit(1);
}
process.stdout.write(`no import cycles (${files.length} files)\n`);
