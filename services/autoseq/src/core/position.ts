/** Where an input event stood in Kafka: its partition and offset (a decimal string). */
export interface Position {
  partition: number;
  offset: string;
  /**
   * The partition's high watermark when the event was read (not stored with a task: see `stored`). A task's
   * position at or past it is not of this topic's records (see `appliedBefore`).
   */
  end?: string;
}

/** What a task keeps of a position: where the event stood, not what the partition held then. */
export const stored = (p: Position): Position => ({ partition: p.partition, offset: p.offset });

/**
 * Whether `pos` is at or before `at` on the same partition: a redelivery of an event already applied. A task's
 * events share a key, so one partition, and are read in offset order; this holds however many events a
 * redelivered batch has, where the id window holds only for its last ids. Not when `at` is at or past the
 * partition's high watermark: every offset this topic ever gave is below it, so `at` is of a topic deleted and
 * created again under the same name (offsets started over), and its new events are new.
 */
export function appliedBefore(at: Position | undefined, pos: Position | undefined): boolean {
  if (at === undefined || pos === undefined || at.partition !== pos.partition) return false;
  if (pos.end !== undefined && BigInt(at.offset) >= BigInt(pos.end)) return false;
  return BigInt(pos.offset) <= BigInt(at.offset);
}
