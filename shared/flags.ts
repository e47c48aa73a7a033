import { parseArgs, type ParseArgsConfig } from 'node:util';
import { errorMessage } from './errors.js';

type Options = NonNullable<ParseArgsConfig['options']>;
export type Flags<O extends Options> = ReturnType<typeof parseArgs<{ args: string[]; options: O }>>['values'];

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
    ({ values } = parseArgs({ args: argv, options }));
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
