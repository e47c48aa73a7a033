import { constants, createWriteStream, unlinkSync, type WriteStream } from 'node:fs';
import { access, chmod, realpath, rename, stat, unlink } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import { finished } from 'node:stream/promises';
import { errorMessage } from './errors.js';

/**
 * Exit code of an offline command given an output path it cannot write (a directory, a missing directory, no
 * permission), as EXIT_UNREADABLE is for an input: the command line is what to fix. It exited 1, as a failed run.
 */
export const EXIT_UNWRITABLE = 2;

/** "cannot write PATH: REASON", naming the path the user gave (never the temporary file beside it). */
export class OutputError extends Error {
  constructor(path: string, reason: string, options?: { cause?: unknown }) {
    super(`cannot write ${path}: ${reason}`, options);
    this.name = 'OutputError';
  }
}

/** The reason in the user's terms: Node's message names the temporary file, which the user never gave. */
function reason(err: unknown, dir: string): string {
  const code = (err as NodeJS.ErrnoException).code;
  switch (code) {
    case 'ENOENT':
      return `ENOENT: no such directory ${dir}`;
    case 'ENOTDIR':
      return 'ENOTDIR: a part of the path is not a directory';
    case 'EISDIR':
      return 'EISDIR: it is a directory';
    case 'EACCES':
    case 'EPERM':
      return `${code}: permission denied`;
    case 'EROFS':
      return 'EROFS: read-only file system';
    case 'ENOSPC':
      return 'ENOSPC: no space left on device';
    default:
      return errorMessage(err);
  }
}

/**
 * Temporary files of this process not yet renamed into place or dropped. Ctrl-C (SIGINT) or SIGTERM in the middle of
 * a long run, or an exit on a path that skipped `abort` (an uncaught error, `process.exit`), left them beside the
 * output: they are removed first. SIGKILL cannot be caught: a file left by it is named with the pid that wrote it.
 */
const pending = new Set<string>();

function removePending(): void {
  for (const temp of pending) {
    try {
      unlinkSync(temp);
    } catch {
      // Already renamed into place or dropped: nothing left to remove.
    }
  }
  pending.clear();
}

function onSignal(signal: NodeJS.Signals): void {
  removePending();
  stopListening();
  // Raised again with Node's default action back in place: the process ends by the signal as every other command
  // does (a shell says 130 or 143), and a shell loop running it stops too, which it does not after an exit(130).
  // A listener of someone else's has this signal already, and the stop is its to make.
  if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
}

// One set of listeners per process, whatever the number of files, and none once every file is settled: a
// command run many times in one process (the tests) does not pile them up.
function stopListening(): void {
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  process.off('exit', removePending);
}

function track(temp: string): void {
  if (pending.size === 0) {
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    process.on('exit', removePending);
  }
  pending.add(temp);
}

function untrack(temp: string): void {
  pending.delete(temp);
  if (pending.size === 0) stopListening();
}

function openStream(path: string, flags: string): Promise<WriteStream> {
  return new Promise((resolve, reject) => {
    const s = createWriteStream(path, { flags });
    s.once('error', reject);
    s.once('open', () => {
      s.off('error', reject);
      resolve(s);
    });
  });
}

/** An output file being written: its path holds the whole output once `commit` resolves, and not before. */
export interface OutputFile {
  stream: NodeJS.WritableStream;
  /** Ends the writing and puts the file in place; an OutputError when either fails (nothing put in place). */
  commit(): Promise<void>;
  /** Drops what was written: the path is left as it was before the command. */
  abort(): Promise<void>;
}

/**
 * Opens an offline command's output before any work, so that a path it cannot write is said at once (an
 * OutputError) rather than after the whole input was read. A regular file is written beside its path
 * (`.<name>.<pid>.<random>.tmp`, same directory, so the same file system) and renamed over it by `commit`: a run
 * that fails, or is killed, never leaves a partial file at the path, and the file it would replace stays as it
 * was. A device or a pipe (`/dev/null`, `/dev/stdout`) has nothing to replace and is written in place.
 */
export async function openOutputFile(path: string): Promise<OutputFile> {
  const dir = dirname(path);
  const fail = (err: unknown) => new OutputError(path, reason(err, dir), { cause: err });
  const st = await stat(path).catch((err: unknown) => {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw fail(err);
  });
  if (st?.isDirectory()) throw new OutputError(path, reason({ code: 'EISDIR' }, dir));
  const failed: { err?: unknown } = {};
  const watch = (s: WriteStream) => {
    // A write that fails (a full disk) is `commit`'s to report, not an unhandled 'error' event.
    s.on('error', (err) => (failed.err ??= err));
    return s;
  };
  if (st && !st.isFile()) {
    const stream = watch(await openStream(path, 'w').catch((err: unknown) => Promise.reject(fail(err))));
    return {
      stream,
      async commit() {
        stream.end();
        await finished(stream).catch((err: unknown) => Promise.reject(fail(failed.err ?? err)));
      },
      async abort() {
        stream.destroy();
        await finished(stream).catch(() => undefined);
      },
    };
  }
  // Through a symbolic link: the file it leads to is replaced, not the link.
  const target = st ? await realpath(path).catch((err: unknown) => Promise.reject(fail(err))) : path;
  // Renaming over a file needs only the directory's permission: one the user may not write stays refused.
  if (st) await access(target, constants.W_OK).catch((err: unknown) => Promise.reject(fail(err)));
  const temp = join(
    dirname(target),
    `.${basename(target)}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`,
  );
  // Tracked before it exists: a signal while it is being created still finds it.
  track(temp);
  const stream = watch(
    await openStream(temp, 'wx').catch((err: unknown) => {
      untrack(temp);
      return Promise.reject(fail(err));
    }),
  );
  const drop = async () => {
    stream.destroy();
    await finished(stream).catch(() => undefined);
    await unlink(temp).catch(() => undefined);
    untrack(temp);
  };
  return {
    stream,
    async commit() {
      try {
        stream.end();
        await finished(stream);
        if (failed.err) throw failed.err;
        // The replaced file's permissions, not the umask's defaults: a file kept private stays so.
        if (st) await chmod(temp, st.mode & 0o7777);
        await rename(temp, target);
        untrack(temp);
      } catch (err) {
        await drop();
        throw fail(failed.err ?? err);
      }
    },
    abort: drop,
  };
}
