import type { SessionState } from '../core/session.js';

interface Entry {
  state: SessionState;
  version: string;
  writtenAt: number;
}

/**
 * Session states this instance wrote recently, by Redis key: write-through (set only after the compare-and-set
 * succeeded, so an entry is never older than what this instance wrote), dropped when a write fails or races,
 * bounded in entries (the oldest write goes first) and in age. The age bound is what bounds staleness across
 * instances: after a rebalance another instance may write a session this one still holds, and a read here
 * serves the older state for at most `maxAgeMs` after this instance's own write.
 */
export class StateCache {
  private readonly entries = new Map<string, Entry>();
  /** Bumped by `clear()`: a read that looked an entry up before a clear can tell that it may no longer answer. */
  generation = 0;
  constructor(
    readonly maxEntries: number,
    readonly maxAgeMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get enabled(): boolean {
    return this.maxEntries > 0 && this.maxAgeMs > 0;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The state this instance last wrote under `key`, while younger than the age bound. */
  get(key: string): { state: SessionState; version: string } | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (this.now() - e.writtenAt >= this.maxAgeMs) {
      this.entries.delete(key);
      return undefined;
    }
    return e;
  }

  /** After a successful compare-and-set: the state is the newest, whatever version was cached before. */
  written(key: string, state: SessionState, version: string): void {
    if (!this.enabled) return;
    // Re-inserting moves the key to the end: Map order is write order, so the first key is the oldest write.
    this.entries.delete(key);
    // Reads never look at the event-id marks (the batch path reads Redis): kept out, an entry is a fraction of the size.
    this.entries.set(key, {
      state: state.seen.length ? { ...state, seen: [] } : state,
      version,
      writtenAt: this.now(),
    });
    if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
  }

  /** A write that failed, raced or may or may not have happened: Redis is the only truth for this key now. */
  drop(key: string): void {
    this.entries.delete(key);
  }

  /** Redis lost its states: every session starts over, so no state written before may answer a read. */
  clear(): void {
    this.entries.clear();
    this.generation++;
  }
}
