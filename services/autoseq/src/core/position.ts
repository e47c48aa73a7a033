/** Where an input event stood in Kafka: its partition and offset (a decimal string). */
export interface Position {
  partition: number;
  offset: string;
}

/**
 * Whether `pos` is at or before `at` on the same partition: a redelivery of an event already applied. A task's
 * events share a key, so one partition, and are read in offset order; this holds however many events a
 * redelivered batch has, where the id window holds only for its last ids.
 */
export function appliedBefore(at: Position | undefined, pos: Position | undefined): boolean {
  if (at === undefined || pos === undefined || at.partition !== pos.partition) return false;
  return BigInt(pos.offset) <= BigInt(at.offset);
}
