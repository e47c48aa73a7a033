#!/usr/bin/env node
// Thin launcher: the CLI is compiled to dist/ by `npm run build` (run by `npm ci` through `prepare`).
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const entry = new URL('../dist/cli/paver.js', import.meta.url);
if (!existsSync(fileURLToPath(entry))) {
  process.stderr.write('paver: dist/ is missing; run `npm ci` (or `npm run build`) first.\n');
  process.exit(1);
}
if (process.argv[2] !== 'run')
  // A reader that stopped early (`paver predict … | head`): stop quietly, as Unix filters do, instead of an
  // unhandled EPIPE and exit 1. A service's logs are not a filter's output: `run` keeps Node's default.
  process.stdout.on('error', (err) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });
const { main, exitOnFault } = await import(entry.href);
if (process.argv[2] !== 'run') exitOnFault(process.argv.slice(2));
const code = await main(process.argv.slice(2));
// A stopped service exits even if a client library left a timer behind; other commands let stdout drain.
if (process.argv[2] === 'run') process.exit(code);
process.exitCode = code;
