import { Ajv, type ValidateFunction } from 'ajv';
import { z } from 'zod';

/**
 * Compiled validators for zod contracts: the consumer's hot path validates every input record and the sink
 * every output record, and zod's interpreter costs about as much per record as a bare consumer spends on the
 * whole message. ajv compiles the contract's own JSON Schema (z.toJSONSchema, the text of schemas/json) to a
 * straight-line function that takes about half of zod's time on the same records
 * (`BENCH_ONLY=validate npm run bench`).
 *
 * A compiled validator must never accept what zod refuses, and must return what zod returns (unknown keys
 * stripped, defaults filled, keys in the schema's order). So a contract is compiled only when every part of
 * it means the same in JSON Schema (see `faithful`); anything else (refinements, transforms, formats, regex
 * flags) stays on zod alone. When the compiled function refuses a value, zod runs anyway: its answer is the
 * one used, and its messages name the field.
 */

type Json = Record<string, unknown>;

/** zod def types whose JSON Schema translation checks exactly what zod checks. */
const FAITHFUL_TYPES = new Set([
  'object',
  'string',
  'number',
  'boolean',
  'null',
  'literal',
  'enum',
  'optional',
  'nullable',
  'default',
  'array',
  'record',
  'unknown',
  'any',
  'union',
  'never',
]);
const FAITHFUL_CHECKS = new Set(['min_length', 'max_length', 'length_equals', 'greater_than', 'less_than']);

interface ZodInternals {
  _zod: { def: Record<string, unknown> & { type?: string; checks?: ZodInternals[] } };
}
const isZod = (x: unknown): x is ZodInternals =>
  typeof x === 'object' && x !== null && '_zod' in x && typeof (x as ZodInternals)._zod?.def === 'object';

/** True when every schema and check under `s` is one whose JSON Schema form is equivalent. */
export function faithful(s: unknown, seen = new Set<unknown>()): boolean {
  if (!isZod(s)) return false;
  if (seen.has(s)) return false; // recursive schemas become $ref: not handled here
  seen.add(s);
  const def = s._zod.def;
  if (!def.type || !FAITHFUL_TYPES.has(def.type)) return false;
  for (const c of def.checks ?? []) {
    const cd = c._zod.def as { check?: string; format?: string; pattern?: RegExp };
    if (cd.check === 'number_format' && cd.format === 'safeint') continue;
    // toJSONSchema keeps a regex's source and drops its flags: only flag-free patterns mean the same.
    if (cd.check === 'string_format' && cd.format === 'regex' && cd.pattern?.flags === '') continue;
    if (!cd.check || !FAITHFUL_CHECKS.has(cd.check)) return false;
  }
  for (const [k, v] of Object.entries(def)) {
    if (k === 'checks') continue;
    if (k === 'shape') {
      for (const child of Object.values(v as Record<string, unknown>))
        if (!faithful(child, new Set(seen))) return false;
    } else if (Array.isArray(v)) {
      for (const child of v) if (isZod(child) && !faithful(child, new Set(seen))) return false;
    } else if (isZod(v) && !faithful(v, new Set(seen))) return false;
  }
  return true;
}

const ajv = new Ajv({
  strict: false,
  allErrors: false,
  // zod runs regexes without the u flag: so does this. (Lengths: both count code points, ajv's default.)
  unicodeRegExp: false,
  useDefaults: false, // defaults are filled by `shape` below, in zod's key order
  removeAdditional: false,
  validateFormats: false,
});

type Shaper = (v: unknown) => unknown;
const identity: Shaper = (v) => v;

/**
 * The output zod would give for a value the schema accepts: objects rebuilt in schema order with unknown keys
 * dropped (zod's default "strip") and defaults filled; unions shaped by the first option that accepts the
 * value, as zod picks it.
 */
function shaper(js: Json): Shaper {
  const options = (js.oneOf ?? js.anyOf) as Json[] | undefined;
  if (options) {
    const shaped = options.map((o) => ({ accepts: ajv.compile(o), shape: shaper(o) }));
    if (shaped.every((o) => o.shape === identity)) return identity;
    return (v) => (shaped.find((o) => o.accepts(v))?.shape ?? identity)(v);
  }
  if (js.type === 'array' && js.items && typeof js.items === 'object' && !Array.isArray(js.items)) {
    const item = shaper(js.items as Json);
    return item === identity ? identity : (v) => (v as unknown[]).map(item);
  }
  const props = js.properties as Record<string, Json> | undefined;
  if (js.type === 'object' && props) {
    const keys = Object.entries(props).map(([k, p]) => ({
      k,
      shape: shaper(p),
      dflt: p.default,
      // A default object or array is copied per record (zod does too); a primitive needs no copy.
      copy: typeof p.default === 'object' && p.default !== null,
    }));
    // additionalProperties false (strict) is refused by the validator; a schema (loose) keeps extra keys.
    const strip = js.additionalProperties === undefined;
    return (v) => {
      const src = v as Json;
      const out: Json = {};
      for (const { k, shape, dflt, copy } of keys) {
        const x = src[k];
        if (x !== undefined) out[k] = shape(x);
        else if (dflt !== undefined) out[k] = copy ? structuredClone(dflt) : dflt;
      }
      if (!strip) for (const k of Object.keys(src)) if (!(k in props)) out[k] = src[k];
      return out;
    };
  }
  return identity;
}

/** The key whose `const` tells a union's options apart (zod's discriminated union), if there is one. */
function discriminator(options: Json[]): string | undefined {
  const first = options[0]?.properties as Record<string, Json> | undefined;
  if (!first) return undefined;
  return Object.keys(first).find((k) =>
    options.every((o) => {
      const p = (o.properties as Record<string, Json> | undefined)?.[k];
      return p?.const !== undefined && (o.required as string[] | undefined)?.includes(k);
    }),
  );
}

function compileJson(js: Json): Compiled<unknown> {
  const options = (js.oneOf ?? js.anyOf) as Json[] | undefined;
  if (options && Object.keys(js).every((k) => k === 'oneOf' || k === 'anyOf' || !KEYWORDS.has(k))) {
    // A union at the root: one compiled function per option, so a record is checked against its own
    // option only (by the discriminator when there is one, else the first that accepts, as zod picks).
    const compiled = options.map((o) => compileJson(o));
    const key = discriminator(options);
    if (key !== undefined) {
      const byConst = new Map<unknown, Compiled<unknown>>();
      options.forEach((o, i) =>
        byConst.set((o.properties as Record<string, Json>)[key]!.const, compiled[i]!),
      );
      return (value) => {
        const tag =
          typeof value === 'object' && value !== null ? (value as Record<string, unknown>)[key] : undefined;
        return byConst.get(tag)?.(value);
      };
    }
    return (value) => {
      for (const c of compiled) {
        const r = c(value);
        if (r) return r;
      }
      return undefined;
    };
  }
  const check: ValidateFunction = ajv.compile(js);
  const shape = shaper(js);
  return (value) => (check(value) ? { value: shape(value) } : undefined);
}
/** Keywords that constrain a value beside a root union (annotations such as $id or title do not). */
const KEYWORDS = new Set([
  'type',
  'properties',
  'required',
  'additionalProperties',
  'allOf',
  'not',
  'enum',
  'const',
  'items',
  '$ref',
]);

/** A compiled check plus zod's output shape; `undefined` when the value is refused (ask zod why). */
export type Compiled<T> = (value: unknown) => { value: T } | undefined;

const compiledCache = new WeakMap<z.ZodType, Compiled<unknown> | null>();

/**
 * The compiled form of a zod schema, or null when the schema has parts JSON Schema cannot say (then zod
 * alone is used). Compiled once per schema object.
 */
export function compile<S extends z.ZodType>(schema: S): Compiled<z.output<S>> | null {
  const hit = compiledCache.get(schema);
  if (hit !== undefined) return hit as Compiled<z.output<S>> | null;
  let c: Compiled<unknown> | null = null;
  if (faithful(schema)) {
    const js = z.toJSONSchema(schema, { io: 'input', target: 'draft-7', unrepresentable: 'throw' }) as Json;
    delete js.$schema;
    c = compileJson(js);
  }
  compiledCache.set(schema, c);
  return c as Compiled<z.output<S>> | null;
}

const acceptsCache = new WeakMap<z.ZodType, (value: unknown) => boolean>();

/**
 * A yes/no check with zod's verdict, for values that are used as they are (outputs): compiled when the
 * schema allows, zod otherwise. Unknown keys are not an error here, as they are not for zod.
 */
export function accepts(schema: z.ZodType): (value: unknown) => boolean {
  let a = acceptsCache.get(schema);
  if (!a) {
    if (faithful(schema)) {
      const js = z.toJSONSchema(schema, { io: 'input', target: 'draft-7', unrepresentable: 'throw' }) as Json;
      delete js.$schema;
      a = ajv.compile(js);
    } else a = (value) => schema.safeParse(value).success;
    acceptsCache.set(schema, a);
  }
  return a;
}

/** Zod's own messages, paths first: they name the field and the expected type, never the offending value. */
export function zodIssues(error: z.ZodError): string {
  return error.issues
    .slice(0, 10)
    .map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`)
    .join('; ');
}

/** A validity check with zod's answer: compiled when the schema allows, zod otherwise or when refused. */
export function checker<S extends z.ZodType>(
  schema: S,
): (value: unknown) => { ok: true; value: z.output<S> } | { ok: false; detail: string } {
  const fast = compile(schema);
  return (value) => {
    const f = fast?.(value);
    if (f) return { ok: true, value: f.value };
    const r = schema.safeParse(value);
    return r.success ? { ok: true, value: r.data } : { ok: false, detail: zodIssues(r.error) };
  };
}
