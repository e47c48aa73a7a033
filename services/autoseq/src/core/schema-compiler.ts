import { Ajv, type Options } from 'ajv';
import * as formats from 'ajv-formats';
import { RE2JS } from 're2js';

// ajv-formats is CommonJS with `exports.default`: under NodeNext the callable sits on `.default`.
const addFormats = formats.default.default;

export type Validate = (value: unknown) => boolean;

/**
 * JSON Schema `pattern`s come from users' catalogs: they run in RE2 (linear time), never in the backtracking
 * JavaScript engine, so no observation can stall the consumer. The `code` string is what ajv would embed in
 * standalone code; Paver compiles in-process only.
 */
function re2Engine(pattern: string, flags: string) {
  const re = RE2JS.compile(pattern, flags.includes('i') ? RE2JS.CASE_INSENSITIVE : 0);
  return { test: (s: string) => re.test(s) };
}
re2Engine.code = 'RE2JS';

/**
 * Compiles each distinct schema once (cached by its canonical text, so an unchanged tool in a new catalog
 * version costs nothing). Errors name the schema problem, never values.
 *
 * Entries are counted by the tools that use them and dropped (from the cache and from ajv's own, which keeps
 * every schema object it compiled) when the last lets go (`release`): a catalog topic whose schemas change (an
 * `enum` of current values, a description with a version) grew both caches, compiled code and all, for the life
 * of the process, as did every schema that failed to compile.
 */
export class SchemaCompiler {
  private readonly ajv: Ajv;
  private readonly cache = new Map<string, { validate: Validate; schema: object; users: number }>();

  constructor() {
    const opts: Options = {
      strict: false, // tool specs carry titles, examples and vendor keywords: tolerate them
      allErrors: false,
      addUsedSchema: false, // two tools may share an $id
      validateFormats: true,
      loadSchema: undefined,
      code: { regExp: re2Engine as unknown as NonNullable<Options['code']>['regExp'] },
    };
    this.ajv = new Ajv(opts);
    addFormats(this.ajv);
  }

  /** The schema's validator; each call is a use, given back with `release` when its tool goes. */
  compile(schema: Record<string, unknown>): Validate {
    const key = JSON.stringify(schema);
    const hit = this.cache.get(key);
    if (hit) {
      hit.users++;
      return hit.validate;
    }
    let fn: ReturnType<Ajv['compile']>;
    try {
      fn = this.ajv.compile(schema);
    } catch (err) {
      // ajv holds the schema object from before it compiles it.
      this.ajv.removeSchema(schema);
      throw err;
    }
    const validate: Validate = (v) => fn(v) === true;
    this.cache.set(key, { validate, schema, users: 1 });
    return validate;
  }

  /** One use of `schema` (a `compile` of a schema of the same text) is over. */
  release(schema: Record<string, unknown>): void {
    const key = JSON.stringify(schema);
    const entry = this.cache.get(key);
    if (!entry || --entry.users > 0) return;
    this.cache.delete(key);
    this.ajv.removeSchema(entry.schema);
  }

  get size(): number {
    return this.cache.size;
  }
}
