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
 */
export class SchemaCompiler {
  private readonly ajv: Ajv;
  private readonly cache = new Map<string, Validate>();

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

  compile(schema: Record<string, unknown>): Validate {
    const key = JSON.stringify(schema);
    const hit = this.cache.get(key);
    if (hit) return hit;
    const fn = this.ajv.compile(schema);
    const validate: Validate = (v) => fn(v) === true;
    this.cache.set(key, validate);
    return validate;
  }

  get size(): number {
    return this.cache.size;
  }
}
