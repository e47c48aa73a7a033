import type { SessionState } from '../core/session.js';
import type { AnswerFromState } from './http.js';
import type { SessionRef } from './redis/store.js';
import type { StateCache } from './state-cache.js';

export interface StateReader {
  /** What this instance last wrote for the session, if cached (no Redis command). */
  cached(ref: SessionRef): SessionState | undefined;
  /** The cached state, else Redis's. */
  read(ref: SessionRef): Promise<{ state: SessionState; cached: boolean }>;
}

/**
 * Allowed-tools reads: a cached state from before a Redis loss must not answer (the session's next event starts it
 * over), so every read waits for the epoch check (`ensure`, one GET). The GET leaves first and the answer from the
 * cached state is computed while it travels, taking that work off the round trip; it is sent only when the check
 * found no loss meanwhile (a loss clears the cache, which bumps its generation), else the state is read again
 * after the check. A state this instance wrote between the lookup and the check's reply is not missed by a read
 * that arrived before it was written, so the answer is still the state at some instant of the request.
 */
export function answerFromState(o: {
  ensure: () => Promise<void>;
  cache: StateCache;
  store: StateReader;
  onRead: (source: 'cache' | 'redis') => void;
}): AnswerFromState {
  return async (ref, respond) => {
    const generation = o.cache.generation;
    const checked = o.ensure();
    const hit = o.store.cached(ref);
    let early: ReturnType<typeof respond> | undefined;
    try {
      if (hit) early = respond(hit);
    } finally {
      await checked;
    }
    if (hit && o.cache.generation === generation) {
      o.onRead('cache');
      return early!;
    }
    const r = await o.store.read(ref);
    o.onRead(r.cached ? 'cache' : 'redis');
    return respond(r.state);
  };
}
