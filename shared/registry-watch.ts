import type { PaverError } from './errors.js';
import type { Logger } from './log.js';
import { pollUntil } from './poll.js';

export interface RegistryWatch {
  /** Why the schema registry is taken for down (the failure that said so), or null. */
  down(): string | null;
  /** Told of each transient failure: a REGISTRY_UNAVAILABLE marks the registry down until `probe` resolves. */
  note(err: PaverError): void;
  stop(): void;
}

/**
 * The schema registry's counterpart of the Redis watch: a registry down for maintenance or unreachable used to
 * fail every framed input and every output until the chunk's retries, then the consumer's restarts, ran out and
 * the process exited, restart after restart for as long as the outage lasted. Marked down, it pauses
 * consumption (`ready` false) and says so on /readyz; consumption makes no registry call meanwhile, so the
 * watch asks the registry itself, every `everyMs`, until it answers.
 */
export function createRegistryWatch(probe: () => Promise<void>, log: Logger, everyMs = 1_000): RegistryWatch {
  let down: string | null = null;
  let stopped = false;
  let poll: { stop(): void } | null = null;
  return {
    down: () => down,
    note(err) {
      if (stopped || err.code !== 'REGISTRY_UNAVAILABLE' || down !== null) return;
      down = err.message;
      log.warn({ err: err.message }, 'schema registry unavailable: consumption waits until it answers');
      poll = pollUntil(
        () => probe().then(() => true),
        everyMs,
        () => {
          log.info({ was: down }, 'schema registry answers again: consumption resumes');
          down = null;
          poll = null;
        },
      );
    },
    stop() {
      stopped = true;
      poll?.stop();
    },
  };
}
