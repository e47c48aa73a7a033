import type { CheckpointLog } from './kafka/checkpoints.js';
import type { RedisDetectorStore } from './redis/store.js';

export interface CheckpointerDeps {
  store: Pick<RedisDetectorStore, 'checkpoint'>;
  checkpoints: Pick<CheckpointLog, 'write'>;
  /** DETECTOR_CHECKPOINT_INTERVAL_MS: per partition, at most one checkpoint this often. */
  intervalMs: number;
  now?: () => number;
}

/**
 * After a batch: the partition's checkpoint (where a rebuild must replay from), read from Redis and written to
 * the checkpoint topic when it moved. Throttled: an older checkpoint is always safe (a longer replay), never a
 * wrong one.
 */
export function createCheckpointer(
  d: CheckpointerDeps,
): (partition: number, next: bigint, epoch: string) => Promise<void> {
  const now = d.now ?? Date.now;
  const last = new Map<number, { at: number; offset: bigint }>();
  return async (partition, next, epoch) => {
    const at = now();
    const prev = last.get(partition);
    if (prev && at - prev.at < d.intervalMs) return;
    const offset = await d.store.checkpoint(partition, next, epoch);
    // The state went after this batch: its next batch rebuilds, from the checkpoint as it stands.
    if (offset === null) return;
    if (prev?.offset !== offset) await d.checkpoints.write(partition, offset, at);
    last.set(partition, { at, offset });
  };
}
