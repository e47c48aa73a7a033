import type { ChainableCommander, Redis } from 'ioredis';
import { classifyError, errorMessage, PaverError, TRANSIENT_REPLY } from '../errors.js';
import { invokeScript } from './scripts.js';

const isReplyError = (err: unknown): boolean =>
  typeof err === 'object' && err !== null && (err as { name?: unknown }).name === 'ReplyError';

/**
 * The one place where a Redis failure becomes a Paver error: connection failures and transient server states
 * are retriable `REDIS_UNAVAILABLE`; an error reply from a command or script is `REDIS_SCRIPT_FAILED` (not
 * retriable); anything else thrown is classified as any error is (a bug in our own code stays `INTERNAL`).
 */
export function redisFailure(what: string, err: unknown): PaverError {
  if (err instanceof PaverError) return err;
  const message = `${what}: ${errorMessage(err)}`;
  if (isReplyError(err))
    return new PaverError(
      TRANSIENT_REPLY.test(errorMessage(err)) ? 'REDIS_UNAVAILABLE' : 'REDIS_SCRIPT_FAILED',
      message,
      {
        cause: err,
      },
    );
  return new PaverError(classifyError(err).code, message, { cause: err });
}

/** Runs a pipeline and returns its replies' values; any failure, whole or per reply, goes through redisFailure. */
export async function execPipeline(pipe: ChainableCommander, what: string): Promise<unknown[]> {
  let replies: [Error | null, unknown][] | null;
  try {
    replies = await pipe.exec();
  } catch (err) {
    throw redisFailure(what, err);
  }
  // Only a MULTI whose watched keys changed resolves to null; Paver's pipelines never watch.
  if (replies === null) throw new PaverError('INTERNAL', `${what}: pipeline discarded`);
  const failed = replies.find(([err]) => err);
  if (failed) throw redisFailure(what, failed[0]);
  return replies.map(([, value]) => value);
}

/** Runs one defined script outside a pipeline; failures go through redisFailure. */
export async function callScript(
  redis: Redis,
  name: string,
  keys: string[],
  argv: (string | number)[],
): Promise<unknown> {
  try {
    return await invokeScript(redis, name, keys, argv);
  } catch (err) {
    throw redisFailure(`script ${name}`, err);
  }
}
