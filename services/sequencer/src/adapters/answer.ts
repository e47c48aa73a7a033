import { PaverError } from '../../../../shared/errors.js';
import type { SessionState } from '../core/session.js';
import type { AnswerFromState } from './http.js';
import type { SessionRef } from './redis/store.js';
import type { StateCache } from './state-cache.js';

export interface StateReader {
  /** What this instance last wrote for the session, if cached (no Redis command). */
  cached(ref: SessionRef): SessionState | undefined;
  /** The state in Redis, never the cache's; null when the read met a Redis loss the check had not seen. */
  fromRedis(ref: SessionRef): Promise<SessionState | null>;
}

/**
 * Allowed-tools reads: a cached state from before a Redis loss must not answer (the session is restored from the
 * session topic, or starts over), so every read waits for the epoch check (`ensure`, one GET; after a loss, the
 * restore). The GET leaves first and the answer from the
 * cached state is computed while it travels, taking that work off the round trip; it is sent only when the check
 * found no loss meanwhile (a loss clears the cache, which bumps its generation), else the state is read again
 * from Redis. A state this instance wrote between the lookup and the check's reply is not missed by a read
 * that arrived before it was written, so the answer is still the state at some instant of the request.
 */
export function answerFromState(o: {
  ensure: () => Promise<void>;
  /** True while the states are being restored after a loss: a GET then may read what the restore has not written yet. */
  rebuilding: () => boolean;
  cache: StateCache;
  store: StateReader;
  onRead: (source: 'cache' | 'redis') => void;
}): AnswerFromState {
  return async (ref, respond) => {
    const generation = o.cache.generation;
    const quiet = !o.rebuilding();
    const checked = o.ensure();
    const hit = o.store.cached(ref);
    // Not cached: the state's GET goes out with the check's, not after it (one round trip, not two). Its value
    // stands only if no loss was found meanwhile (a loss clears the cache, which bumps its generation): a GET
    // that met the loss read a state the restore has not written back yet.
    const fromRedis = hit || !quiet ? undefined : o.store.fromRedis(ref);
    // Awaited below, maybe after a whole restore: a failure meanwhile must not be an unhandled rejection.
    fromRedis?.catch(() => undefined);
    let early: ReturnType<typeof respond> | undefined;
    try {
      if (hit) early = respond(hit);
    } finally {
      // Either failure fails the read; the other promise must not be left rejected and unhandled.
      await checked;
    }
    const same = o.cache.generation === generation;
    if (hit && same) {
      o.onRead('cache');
      return early!;
    }
    // Read again after a loss: from what the restore wrote back (or, without the session copy, nothing: the
    // session starts over).
    let state = await (fromRedis && same ? fromRedis : o.store.fromRedis(ref));
    // A loss between the check and the read (the check runs on a connection of its own): check again, which
    // restores, and read again.
    for (let i = 0; state === null && i < 3; i++) {
      await o.ensure();
      state = await o.store.fromRedis(ref);
    }
    if (state === null)
      throw new PaverError('STATE_CONTENDED', 'Redis lost its state again and again during a session read');
    o.onRead('redis');
    return respond(state);
  };
}
