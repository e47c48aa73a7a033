import { parseArgs, type ParseArgsConfig } from 'node:util';
import { errorMessage } from './errors.js';

type Options = NonNullable<ParseArgsConfig['options']>;
export type Flags<O extends Options> = ReturnType<typeof parseArgs<{ args: string[]; options: O }>>['values'];

/**
 * `--name value` as `--name=value` for each option that takes a value. commander (which parses every command
 * first) takes the word after such an option as its value whatever it starts with; parseArgs refuses one that
 * starts with '-' as ambiguous, so `--min-length -1` got that refusal and the whole usage instead of the range,
 * and `--query "-50% off?"` could not be asked at all.
 */
export function joinValues(argv: string[], options: Options): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      out.push(...argv.slice(i));
      break;
    }
    const name = a.startsWith('--') && !a.includes('=') ? a.slice(2) : undefined;
    if (
      name !== undefined &&
      Object.hasOwn(options, name) &&
      options[name]!.type === 'string' &&
      i + 1 < argv.length
    )
      out.push(`${a}=${argv[++i]!}`);
    else out.push(a);
  }
  return out;
}

/**
 * An offline command's flags, the one way every command reads them: a bad flag prints the error and the
 * usage on stderr and gives exit code 2; `--help` prints the usage on stdout and gives 0. A number means
 * "return this"; anything else is the flags.
 */
export function parseFlags<const O extends Options>(
  command: string,
  usage: string,
  argv: string[],
  options: O,
): Flags<O> | number {
  let values: Flags<O>;
  try {
    ({ values } = parseArgs({ args: joinValues(argv, options), options }));
  } catch (err) {
    process.stderr.write(`paver ${command}: ${errorMessage(err)}\n\n${usage}`);
    return 2;
  }
  if ((values as { help?: boolean }).help) {
    process.stdout.write(usage);
    return 0;
  }
  return values;
}

/** What a numeric flag accepts: the range of the environment variable its service reads for the same setting. */
export interface NumberRange {
  min: number;
  max?: number;
  integer?: boolean;
  /** min itself is refused (a precision must be above 0). */
  aboveMin?: boolean;
  /** max itself is refused. */
  belowMax?: boolean;
}

/** A numeric flag's value out of its range, or not a number: a usage error whose message names the flag. */
export class FlagError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FlagError';
  }
}

const describeRange = (r: NumberRange): string => {
  const kind = r.integer ? 'an integer' : 'a number';
  const lo = Number.isFinite(r.min) ? ` ${r.aboveMin ? '>' : '≥'} ${r.min}` : '';
  const hi =
    r.max === undefined || r.max === Number.MAX_SAFE_INTEGER
      ? ''
      : `${lo ? ' and' : ''} ${r.belowMax ? '<' : '≤'} ${r.max}`;
  return `${kind}${lo}${hi}`;
};

/**
 * A numeric flag, `dflt` when it is absent. A blank value is not a number: `Number` alone read '' as 0, so
 * `--target-precision ''` quietly meant 0.
 */
export function numberFlag(flag: string, raw: string | undefined, dflt: number, r: NumberRange): number {
  if (raw === undefined) return dflt;
  // An integer variable of the services' configuration is at most MAX_SAFE_INTEGER (shared/config.ts int()).
  const max = r.max ?? (r.integer ? Number.MAX_SAFE_INTEGER : undefined);
  const n = raw.trim() === '' ? NaN : Number(raw);
  const ok =
    Number.isFinite(n) &&
    (!r.integer || Number.isInteger(n)) &&
    (r.aboveMin ? n > r.min : n >= r.min) &&
    (max === undefined || (r.belowMax ? n < max : n <= max));
  if (!ok) throw new FlagError(`--${flag} must be ${describeRange(r)}, got '${raw.slice(0, 40)}'`);
  return n;
}
