/**
 * Argument bindings: where the value of a tool call's argument comes from, learned from what an agent did.
 *
 * One module, two callers (autoseq's learned rules, flows' input maps). Pure: plain data in, plain data out,
 * deterministic. A caller gives the earlier calls of one task (oldest first), the task's first user message,
 * and either an observed next call (to enumerate the sources that reproduce each argument value) or a set
 * of learned bindings (to build the next call's arguments, or fail when any argument has no value).
 *
 * Source kinds (a `Source` is plain JSON, so callers can store it and compare it by `sourceKey`):
 * - `prev`:  a path in the previous call's output (`part: "out"`) or arguments (`part: "args"`);
 * - `last`:  a path in the last call of tool X (output or arguments); list elements are path indices;
 * - `loop`:  the first element of a list in the last call of tool X that no earlier call of the next tool
 *            in this task took as an argument value (the agent walks the list in order, one call per
 *            element, skipping what it has already looked at);
 * - `pick`:  the element of a list in the last call of tool X that mentions a word of the user's request (the
 *            first such element: the item the user named, among an order's items);
 * - `const`: the same value every time;
 * - `user`:  the n-th token of the user's text that matches a shape pattern learned from the value
 *            (verbatim substring: the value itself never becomes part of the binding);
 * - `said`:  the same in the user's latest message after the first: what the user answered when the agent
 *            asked (an email, an order number), which the first message did not hold.
 */

import { own, setOwn } from './own.js';
import { mentionsRequest } from './mentions.js';

export type PathSeg = string | number;
export type Path = readonly PathSeg[];
export type Part = 'out' | 'args';

export type Source =
  | { kind: 'prev'; part: Part; path: Path }
  | { kind: 'last'; tool: string; part: Part; path: Path }
  | { kind: 'loop'; tool: string; part: Part; list: Path; item: Path }
  | { kind: 'pick'; tool: string; part: Part; list: Path; item: Path }
  | { kind: 'const'; value: unknown }
  | { kind: 'user'; pattern: string; index: number }
  | { kind: 'said'; pattern: string; index: number };

export interface PastCall {
  tool: string;
  args?: Record<string, unknown> | undefined;
  observation?: unknown;
  /** What the producer said (`status`: `error` is true, `ok` false), whatever the output looks like. */
  failed?: boolean;
}

export interface BindingContext {
  /** Earlier calls of the task, oldest first. */
  calls: readonly PastCall[];
  /** The task's first user message, when known. */
  userText?: string | undefined;
  /** The task's latest user message after the first, when there is one. */
  saidText?: string | undefined;
}

/** One unit of a call's arguments: a top-level argument, or a leaf inside one when the whole has no source. */
export interface ArgUnit {
  path: Path;
  sources: Source[];
  /** `sourceKey` of each source, in the same order. */
  keys: string[];
}

export interface Binding {
  path: Path;
  source: Source;
}

export interface EnumerateOptions {
  /** Most sources kept per value (the preferred ones first): bounds work and storage. */
  maxSources: number;
  /** Deepest path searched inside an output or arguments. */
  maxDepth: number;
  /** Nodes visited per call part before the search stops (huge outputs stay cheap). */
  maxNodes: number;
  /** Longest constant (canonical JSON characters) offered as a `const` source. */
  maxConstChars: number;
}

export const DEFAULT_ENUMERATE: EnumerateOptions = {
  maxSources: 12,
  maxDepth: 8,
  maxNodes: 5000,
  maxConstChars: 128,
};

/** JSON with sorted object keys, so deep-equal values have the same text; `undefined` members are dropped. */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return v === undefined ? 'null' : JSON.stringify(v);
  // Plain loops and concatenation: this runs for every source of every argument on the hot path.
  if (Array.isArray(v)) {
    let out = '[';
    for (let i = 0; i < v.length; i++) out += (i > 0 ? ',' : '') + canonicalJson(v[i]);
    return out + ']';
  }
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o).sort();
  let out = '{';
  let first = true;
  for (const k of keys) {
    const x = o[k];
    if (x === undefined) continue;
    out += (first ? '' : ',') + JSON.stringify(k) + ':' + canonicalJson(x);
    first = false;
  }
  return out + '}';
}

/** `canonicalJson(p)`: a path is a flat list of strings and numbers, which JSON.stringify writes the same way. */
export const pathKey = (p: Path): string => JSON.stringify(p);

/**
 * A stable identity for a source: `canonicalJson(s)` (sorted keys), written per kind without sorting, since
 * enumeration keys every source it finds (`part` is `out` or `args`: no escaping needed).
 */
export function sourceKey(s: Source): string {
  switch (s.kind) {
    case 'prev':
      return `{"kind":"prev","part":"${s.part}","path":${pathKey(s.path)}}`;
    case 'last':
      return `{"kind":"last","part":"${s.part}","path":${pathKey(s.path)},"tool":${JSON.stringify(s.tool)}}`;
    case 'loop':
      return `{"item":${pathKey(s.item)},"kind":"loop","list":${pathKey(s.list)},"part":"${s.part}","tool":${JSON.stringify(s.tool)}}`;
    case 'pick':
      return `{"item":${pathKey(s.item)},"kind":"pick","list":${pathKey(s.list)},"part":"${s.part}","tool":${JSON.stringify(s.tool)}}`;
    case 'const':
      return constKey(canonicalJson(s.value), s.value);
    case 'user':
    case 'said':
      return `{"index":${JSON.stringify(s.index)},"kind":"${s.kind}","pattern":${JSON.stringify(s.pattern)}}`;
  }
}

/** The key of a `const` source whose value has canonical text `text` (canonicalJson drops an undefined member). */
const constKey = (text: string, value: unknown) =>
  value === undefined ? '{"kind":"const"}' : `{"kind":"const","value":${text}}`;

export function getPath(root: unknown, path: Path): { ok: true; value: unknown } | { ok: false } {
  let cur = root;
  for (const seg of path) {
    if (typeof seg === 'number') {
      if (!Array.isArray(cur) || seg < 0 || seg >= cur.length) return { ok: false };
      cur = cur[seg];
    } else {
      if (cur === null || typeof cur !== 'object' || Array.isArray(cur)) return { ok: false };
      if (!Object.prototype.hasOwnProperty.call(cur, seg)) return { ok: false };
      cur = (cur as Record<string, unknown>)[seg];
    }
  }
  return cur === undefined ? { ok: false } : { ok: true, value: cur };
}

const partOf = (c: PastCall, part: Part): unknown => (part === 'out' ? c.observation : c.args);

function lastIndexOf(calls: readonly PastCall[], tool: string): number {
  for (let i = calls.length - 1; i >= 0; i--) if (calls[i]!.tool === tool) return i;
  return -1;
}

/**
 * Canonical texts of the argument values earlier calls of `tool` took (top-level arguments): what a loop over
 * a list has already used. Element values are compared whole, so an id taken by any argument counts.
 */
function usedBy(calls: readonly PastCall[], tool: string): Set<string> {
  // Asked for every loop source of every rule and argument after a call, over the same history: memoised per
  // history array (callers build a new one per call) and tool; derived data only, so answers stay deterministic.
  let byTool = usedCache.get(calls);
  if (!byTool) usedCache.set(calls, (byTool = new Map()));
  let used = byTool.get(tool);
  if (used) return used;
  used = new Set<string>();
  for (const c of calls) {
    if (c.tool !== tool || !c.args) continue;
    for (const v of Object.values(c.args)) if (v !== undefined) used.add(canonicalJson(v));
  }
  byTool.set(tool, used);
  return used;
}
const usedCache = new WeakMap<readonly PastCall[], Map<string, Set<string>>>();

/** Index of the first element of `list` that mentions a word of the user's request, or -1. */
function firstMentioning(list: readonly unknown[], userText: string | undefined): number {
  if (!userText) return -1;
  for (let j = 0; j < list.length; j++) if (mentionsRequest(list[j], userText)) return j;
  return -1;
}

/** Index of the first element of `list` whose `item` value is not in `used`, or -1. */
function firstUnused(list: readonly unknown[], item: Path, used: ReadonlySet<string>): number {
  for (let j = 0; j < list.length; j++) {
    const v = getPath(list[j], item);
    if (v.ok && !used.has(canonicalJson(v.value))) return j;
  }
  return -1;
}

// ---- user text shapes ----------------------------------------------------------------------------------

const BOUNDARY_CHARS = 'A-Za-z0-9_';
const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
const charClass = (c: string): string =>
  /[A-Z]/.test(c) ? 'A' : /[a-z]/.test(c) ? 'a' : /[0-9]/.test(c) ? '9' : c;
const CLASS_RE: Record<string, string> = { A: '[A-Z]', a: '[a-z]', '9': '[0-9]' };
/** Not at the start of the text or of a sentence (after `.`, `!`, `?`, `:` or a line break, and spaces). */
const MID_SENTENCE = '(?<!(?:^|[.!?:\\n])[\\s"\'(]*)';
/** Characters that join the parts of one token (an address, a code): its value runs through them. */
const TOKEN_CHAR = '[A-Za-z0-9_.%+-]';

/**
 * Two shapes per value, so that either can prove consistent across tasks: the run signature (`emma_kim_9957`
 * → letters `_` letters `_` digits) and the character set with the exact length (`EHGLP3` → 6 of [A-Z0-9]).
 */
export function userShapes(value: string): string[] {
  if (value.length < 2 || value.length > 200 || /\s/.test(value)) return [];
  const runs: string[] = [];
  for (const ch of value) {
    const c = charClass(ch);
    if (runs[runs.length - 1] !== c) runs.push(c);
  }
  const runRe = runs.map((c) => (CLASS_RE[c] ? `${CLASS_RE[c]}+` : escapeRe(c))).join('');
  const sets = new Set<string>();
  for (const ch of value) sets.add(charClass(ch));
  const letters =
    sets.has('A') && sets.has('a') ? 'A-Za-z' : sets.has('A') ? 'A-Z' : sets.has('a') ? 'a-z' : '';
  const others = [...sets]
    .filter((c) => !CLASS_RE[c])
    .sort()
    .map((c) => escapeRe(c))
    .join('');
  const digits = sets.has('9') || letters === 'A-Z' ? '0-9' : '';
  const setRe = `[${letters}${digits}${others}]{${value.length}}`;
  const shapes = runRe === setRe ? [runRe] : [runRe, setRe];
  // A capitalised word (a name): its index among all capitalised words moves with how the message opens
  // ("Hi, I'm Mia" / "Hello! My name is Mia"); among those that do not start a sentence, it does not.
  if (/^[A-Z][a-z]/.test(value)) shapes.push(`${MID_SENTENCE}${runRe}`);
  // A token marked by a character that joins no words (`@`, `#`, `:`…): its runs vary from one value to the
  // next (`mia.lee42@example.com`, `omar@mail.net`), but "the token that holds this character" does not.
  if (/^[A-Za-z0-9]/.test(value) && /[A-Za-z0-9]$/.test(value))
    for (const c of new Set(value.replace(/[A-Za-z0-9_.%+-]/g, '')))
      shapes.push(`${TOKEN_CHAR}*${escapeRe(c)}${TOKEN_CHAR}*[A-Za-z0-9]`);
  return shapes;
}

const compiled = new Map<string, RegExp>();
/** `g` for a scan of the whole text; `y` (sticky) for one start, as token shapes are tried. */
function shapeRegExp(pattern: string, flags: 'g' | 'y'): RegExp {
  const key = flags + pattern;
  let re = compiled.get(key);
  if (!re) {
    re = new RegExp(`(?<![${BOUNDARY_CHARS}])${pattern}(?![${BOUNDARY_CHARS}])`, flags);
    if (compiled.size > 4096) compiled.clear();
    compiled.set(key, re);
  }
  return re;
}

const TOKEN_LEAD = `${TOKEN_CHAR}*`;
const isTokenChar = (c: number) =>
  (c >= 48 && c <= 57) ||
  (c >= 65 && c <= 90) ||
  (c >= 97 && c <= 122) ||
  c === 95 ||
  c === 46 ||
  c === 37 ||
  c === 43 ||
  c === 45;
const isBoundaryChar = (c: number) =>
  (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95;

function userMatches(text: string, pattern: string): string[] {
  if (!pattern.startsWith(TOKEN_LEAD)) {
    const re = shapeRegExp(pattern, 'g');
    re.lastIndex = 0;
    return [...text.matchAll(re)].map((m) => m[0]);
  }
  // A token shape (`TOKEN_CHAR* c …`, c not a token character) scanned by the regular expression alone is
  // quadratic: every start after a `.`, `-`, `%` or `+` runs to the end of its run of token characters before
  // failing, and a 64 KiB message of "a.a.a…" took seconds. From any start inside one run, `TOKEN_CHAR*` can
  // only end at that run's end, so every start in it succeeds or fails alike: the first allowed one is tried,
  // and on failure the scan jumps past the run. Same matches as the plain scan, in linear time.
  const re = shapeRegExp(pattern, 'y');
  const out: string[] = [];
  let i = 0;
  while (i < text.length) {
    if (i > 0 && isBoundaryChar(text.charCodeAt(i - 1))) {
      i++;
      continue;
    }
    re.lastIndex = i;
    const m = re.exec(text);
    if (m) {
      out.push(m[0]);
      i = Math.max(re.lastIndex, i + 1);
      continue;
    }
    let j = i;
    while (j < text.length && isTokenChar(text.charCodeAt(j))) j++;
    i = j > i ? j : i + 1;
  }
  return out;
}

// ---- resolve -------------------------------------------------------------------------------------------

export type Resolved = { ok: true; value: unknown } | { ok: false };
const NONE: Resolved = { ok: false };

/** The value a source gives for the call of `nextTool` that would follow `ctx.calls`. */
export function resolveSource(ctx: BindingContext, nextTool: string, s: Source): Resolved {
  const calls = ctx.calls;
  switch (s.kind) {
    case 'const':
      return { ok: true, value: s.value };
    case 'prev': {
      const c = calls[calls.length - 1];
      return c ? getPath(partOf(c, s.part), s.path) : NONE;
    }
    case 'last': {
      const i = lastIndexOf(calls, s.tool);
      return i < 0 ? NONE : getPath(partOf(calls[i]!, s.part), s.path);
    }
    case 'loop': {
      const i = lastIndexOf(calls, s.tool);
      if (i < 0) return NONE;
      const list = getPath(partOf(calls[i]!, s.part), s.list);
      if (!list.ok || !Array.isArray(list.value)) return NONE;
      const at = firstUnused(list.value, s.item, usedBy(calls, nextTool));
      return at < 0 ? NONE : getPath(list.value[at], s.item);
    }
    case 'pick': {
      const i = lastIndexOf(calls, s.tool);
      if (i < 0) return NONE;
      const list = getPath(partOf(calls[i]!, s.part), s.list);
      if (!list.ok || !Array.isArray(list.value)) return NONE;
      const at = firstMentioning(list.value, ctx.userText);
      return at < 0 ? NONE : getPath(list.value[at], s.item);
    }
    case 'user':
    case 'said': {
      const text = s.kind === 'user' ? ctx.userText : ctx.saidText;
      if (!text) return NONE;
      const m = userMatches(text, s.pattern);
      return s.index < m.length ? { ok: true, value: m[s.index] } : NONE;
    }
  }
}

function setPath(root: Record<string, unknown>, path: Path, value: unknown): boolean {
  let cur: Record<string, unknown> | unknown[] = root;
  for (let i = 0; i < path.length; i++) {
    const seg = path[i]!;
    const last = i === path.length - 1;
    const nextSeg = path[i + 1];
    const key = seg as never;
    if (Array.isArray(cur) !== (typeof seg === 'number')) return false;
    // Argument names are the agent's: own properties only (`__proto__` would reach Object.prototype).
    if (last) {
      setOwn(cur as Record<string, unknown>, key, value);
      return true;
    }
    let child = own(cur as Record<string, unknown>, key);
    if (child === undefined)
      child = setOwn(cur as Record<string, unknown>, key, typeof nextSeg === 'number' ? [] : {});
    if (child === null || typeof child !== 'object') return false;
    cur = child as Record<string, unknown> | unknown[];
  }
  return true;
}

export type Built = { ok: true; args: Record<string, unknown> } | { ok: false; missing: Path };

/**
 * The arguments of the next call of `nextTool` from learned bindings, or the first argument path with no
 * value. Bindings of leaves inside one argument rebuild that argument's object/array structure.
 */
export function buildArgs(ctx: BindingContext, nextTool: string, bindings: readonly Binding[]): Built {
  const args: Record<string, unknown> = {};
  for (const b of bindings) {
    const r = resolveSource(ctx, nextTool, b.source);
    if (
      !r.ok ||
      b.path.length === 0 ||
      !exact(r.value) ||
      !setPath(args, b.path, structuredCloneJson(r.value))
    )
      return { ok: false, missing: b.path };
  }
  // Leaf bindings may leave holes in arrays: such an argument was not rebuilt faithfully.
  for (const b of bindings)
    if (b.path.length > 1 && hasHole(own(args, b.path[0] as string))) return { ok: false, missing: b.path };
  return { ok: true, args };
}

function hasHole(v: unknown): boolean {
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) if (!(i in v) || hasHole(v[i])) return true;
    return false;
  }
  if (v && typeof v === 'object') return Object.values(v).some(hasHole);
  return false;
}

/**
 * False when `v` holds an integer beyond ±2^53: JSON text gave more digits than a double keeps, so the value
 * read here is not the one the producer wrote (a 64-bit id such as 1234567890123456789 reads as
 * 1234567890123456800). Copied into a proposal, it would name another record; compared with the agent's own
 * call, read the same way, it would even score as a hit. Such a value is never bound nor proposed.
 */
export function exact(v: unknown, depth = 0): boolean {
  if (typeof v === 'number') return !Number.isInteger(v) || Number.isSafeInteger(v);
  if (v === null || typeof v !== 'object') return true;
  if (depth > 64) return false;
  for (const x of Array.isArray(v) ? v : Object.values(v)) if (!exact(x, depth + 1)) return false;
  return true;
}

const structuredCloneJson = (v: unknown): unknown =>
  v !== null && typeof v === 'object' ? (JSON.parse(JSON.stringify(v)) as unknown) : v;

// ---- enumerate -----------------------------------------------------------------------------------------

interface Hit {
  call: number;
  part: Part;
  path: PathSeg[];
}

/** Cheap pre-check before comparing containers by canonical text. */
function sameShape(a: object, b: unknown): boolean {
  if (Array.isArray(a)) return Array.isArray(b) && a.length === b.length;
  return (
    b !== null &&
    typeof b === 'object' &&
    !Array.isArray(b) &&
    Object.keys(a).length === Object.keys(b).length
  );
}

/**
 * The canonical text of a container inside an earlier call, memoised per object: the same outputs are
 * searched for every container argument of every later call of the task (derived data only, as below).
 */
const canonicalTexts = new WeakMap<object, string>();
function canonicalOf(node: object): string {
  let t = canonicalTexts.get(node);
  if (t === undefined) canonicalTexts.set(node, (t = canonicalJson(node)));
  return t;
}

/** Every path under `root` whose value is canonically equal to `value` (`target`: its canonical text; bounded walk). */
function findPaths(
  root: unknown,
  value: unknown,
  target: string,
  opts: EnumerateOptions,
  out: PathSeg[][],
): void {
  let visited = 0;
  const container = value !== null && typeof value === 'object';
  // One path stack for the walk (copied only into results): this runs per argument per earlier call.
  const path: PathSeg[] = [];
  const walk = (node: unknown) => {
    if (++visited > opts.maxNodes || out.length >= opts.maxSources * 4) return;
    const isObj = node !== null && typeof node === 'object';
    // Scalars compare directly; containers by canonical text, only when the value is a container too.
    if (isObj ? container && sameShape(node, value) && canonicalOf(node) === target : node === value) {
      out.push([...path]);
      return;
    }
    if (!isObj || path.length >= opts.maxDepth) return;
    walkChildren(node, path, walk);
  };
  walk(root);
}

/** Calls `visit` on each child of a container with `path` extended by the child's index or key (then restored). */
function walkChildren(node: object, path: PathSeg[], visit: (child: unknown) => void): void {
  if (Array.isArray(node)) {
    for (let i = 0; i < node.length; i++) {
      if (!(i in node)) continue;
      path.push(i);
      visit(node[i]);
      path.pop();
    }
    return;
  }
  for (const k of Object.keys(node)) {
    path.push(k);
    visit((node as Record<string, unknown>)[k]);
    path.pop();
  }
}

const scalarKey = (v: unknown) => `${typeof v}:${String(v)}`;

/**
 * Where each non-empty string or number occurs inside one call's output or arguments (paths in walk order),
 * memoised per object: a task's earlier calls are indexed once, not once per argument per event. The cache
 * holds only derived data of objects the caller still references (WeakMap), so results stay deterministic.
 */
const partIndexes = new WeakMap<object, Map<string, PathSeg[][]>>();
function partIndex(root: unknown, opts: EnumerateOptions): Map<string, PathSeg[][]> | null {
  if (root === null || typeof root !== 'object') return null;
  const cached = partIndexes.get(root);
  if (cached) return cached;
  const index = new Map<string, PathSeg[][]>();
  let visited = 0;
  const path: PathSeg[] = [];
  const walk = (node: unknown) => {
    if (++visited > opts.maxNodes) return;
    if (node === null || typeof node !== 'object') {
      if ((typeof node === 'string' && node.length > 0) || typeof node === 'number') {
        const k = scalarKey(node);
        let l = index.get(k);
        if (!l) index.set(k, (l = []));
        if (l.length < opts.maxSources * 4) l.push([...path]);
      }
      return;
    }
    if (path.length >= opts.maxDepth) return;
    walkChildren(node, path, walk);
  };
  walk(root);
  partIndexes.set(root, index);
  return index;
}

/**
 * Drops the indexes of these calls' outputs and arguments (`partIndex`): a task that ended is rarely searched
 * again, and offline, where every task's state stays in memory, its indexes (several times the size of the
 * outputs) would stay with it. Derived data only: an index asked for again is rebuilt, the same.
 */
export function forgetIndexes(calls: readonly PastCall[]): void {
  for (const c of calls)
    for (const root of [c.observation, c.args])
      if (root !== null && typeof root === 'object') partIndexes.delete(root);
}

/** Paths of the scalar `value` (`key`: its scalarKey) under `root`. */
function scalarPaths(root: unknown, key: string, value: unknown, opts: EnumerateOptions): PathSeg[][] {
  const index = partIndex(root, opts);
  if (index) return index.get(key) ?? [];
  return root === value ? [[]] : [];
}

/**
 * The sources that reproduce `value` as an argument of a call of `nextTool` following `ctx.calls`, the
 * preferred first: relative to the previous call, then to the last call of a tool, then a loop over a list,
 * then the user's text, then the constant. Each returned source resolves to exactly `value`.
 */
export function enumerateSources(
  ctx: BindingContext,
  nextTool: string,
  value: unknown,
  opts: EnumerateOptions = DEFAULT_ENUMERATE,
): Source[] {
  return keyedSources(ctx, nextTool, value, opts).sources;
}

/** `enumerateSources` with each source's `sourceKey` (computed anyway to deduplicate; callers store by it). */
function keyedSources(
  ctx: BindingContext,
  nextTool: string,
  value: unknown,
  opts: EnumerateOptions,
): { sources: Source[]; keys: string[] } {
  const found: Source[] = [];
  const keys: string[] = [];
  const out = { sources: found, keys };
  const seen = new Set<string>();
  /** Adds a source (`k`: its key) unless already found; false once the list is full. */
  const add = (src: Source, k: string): boolean => {
    if (found.length >= opts.maxSources) return false;
    if (!seen.has(k)) {
      seen.add(k);
      found.push(src);
      keys.push(k);
    }
    return found.length < opts.maxSources;
  };
  // No source explains a value that was not read exactly: the argument stays unbound (split into leaves, only
  // its inexact ones do), so no rule proposes it.
  if (!exact(value)) return out;
  const calls = ctx.calls;
  const scalar = value === null || typeof value !== 'object';
  const canonical = canonicalJson(value);
  // Trivial scalars (booleans, null, empty strings) are found everywhere: only the constant explains them.
  const searchable = (typeof value === 'string' && value.length > 0) || typeof value === 'number' || !scalar;
  if (searchable) {
    const hits: Hit[] = [];
    const key = scalar ? scalarKey(value) : '';
    // Only the last call of each tool can be addressed (`last`), plus the previous call (`prev`).
    const seenTools = new Set<string>();
    for (let i = calls.length - 1; i >= 0; i--) {
      const c = calls[i]!;
      if (seenTools.has(c.tool)) continue;
      seenTools.add(c.tool);
      for (const part of ['out', 'args'] as const) {
        const paths: PathSeg[][] = [];
        if (scalar) paths.push(...scalarPaths(partOf(c, part), key, value, opts));
        else findPaths(partOf(c, part), value, canonical, opts, paths);
        for (const p of paths) hits.push({ call: i, part, path: p });
      }
    }
    // Kinds in preference order, each in hit order; deduplicated; stops at maxSources, so a common value
    // (found in hundreds of places) costs a few sources, not hundreds of keys.
    const prev = calls.length - 1;
    const pathKeys: (string | undefined)[] = [];
    const pathKeyOf = (i: number) => (pathKeys[i] ??= pathKey(hits[i]!.path));
    for (let i = 0; i < hits.length; i++) {
      const h = hits[i]!;
      if (h.call !== prev) continue;
      const k = `{"kind":"prev","part":"${h.part}","path":${pathKeyOf(i)}}`;
      if (!add({ kind: 'prev', part: h.part, path: h.path }, k)) return out;
    }
    for (let i = 0; i < hits.length; i++) {
      const h = hits[i]!;
      const tool = calls[h.call]!.tool;
      const k = `{"kind":"last","part":"${h.part}","path":${pathKeyOf(i)},"tool":${JSON.stringify(tool)}}`;
      if (!add({ kind: 'last', tool, part: h.part, path: h.path }, k)) return out;
    }
    // Every list element the value was found in: the element's index, its list and the path inside it.
    const elements: { h: Hit; at: number; list: unknown[]; path: Path; item: Path }[] = [];
    for (const h of hits)
      for (let j = 0; j < h.path.length; j++) {
        const at = h.path[j];
        if (typeof at !== 'number') continue;
        const list = getPath(partOf(calls[h.call]!, h.part), h.path.slice(0, j));
        if (list.ok && Array.isArray(list.value))
          elements.push({ h, at, list: list.value, path: h.path.slice(0, j), item: h.path.slice(j + 1) });
      }
    // The walk: the first element no earlier call of the next tool took; then the element the user named.
    for (const kind of ['loop', 'pick'] as const)
      for (const el of elements) {
        const first =
          kind === 'loop'
            ? firstUnused(el.list, el.item, usedBy(calls, nextTool))
            : firstMentioning(el.list, ctx.userText);
        if (first !== el.at) continue;
        const s: Source = {
          kind,
          tool: calls[el.h.call]!.tool,
          part: el.h.part,
          list: el.path,
          item: el.item,
        };
        if (!add(s, sourceKey(s))) return out;
      }
  }
  for (const [kind, text] of [
    ['user', ctx.userText],
    ['said', ctx.saidText],
  ] as const) {
    if (typeof value !== 'string' || !text || !text.includes(value)) continue;
    for (const pattern of userShapes(value)) {
      const index = userMatches(text, pattern).indexOf(value);
      if (index < 0) continue;
      const src: Source = { kind, pattern, index };
      if (!add(src, sourceKey(src))) return out;
    }
  }
  // A long value is an unlikely constant and would bloat whoever stores sources: only short ones qualify.
  if (canonical.length <= opts.maxConstChars) add({ kind: 'const', value }, constKey(canonical, value));
  return out;
}

/**
 * The units of an observed call's arguments with their sources: each top-level argument as a whole when
 * some non-constant source reproduces it, else (objects and arrays) each leaf inside it, so that an argument
 * assembled from several places is still bindable. Units are in a stable order (sorted paths).
 */
export function enumerateArgs(
  ctx: BindingContext,
  nextTool: string,
  args: Record<string, unknown> | undefined,
  opts: EnumerateOptions = DEFAULT_ENUMERATE,
): ArgUnit[] {
  const units: ArgUnit[] = [];
  const leaves = (v: unknown, path: PathSeg[]) => {
    if (v !== null && typeof v === 'object' && path.length <= opts.maxDepth) {
      const entries: [PathSeg, unknown][] = Array.isArray(v)
        ? v.map((x, i) => [i, x])
        : Object.keys(v)
            .sort()
            .map((k) => [k, (v as Record<string, unknown>)[k]]);
      if (entries.length > 0) {
        for (const [k, x] of entries) if (x !== undefined) leaves(x, [...path, k]);
        return;
      }
    }
    units.push({ path, ...keyedSources(ctx, nextTool, v, opts) });
  };
  for (const name of Object.keys(args ?? {}).sort()) {
    const v = args![name];
    if (v === undefined) continue;
    const whole = keyedSources(ctx, nextTool, v, opts);
    if (v === null || typeof v !== 'object' || whole.sources.some((s) => s.kind !== 'const'))
      units.push({ path: [name], ...whole });
    else leaves(v, [name]);
  }
  return units;
}
