import type { Epoch } from '../../../../shared/redis/epoch.js';
import { PaverError } from '../../../../shared/errors.js';
import type { BatchContext } from '../../../../shared/kafka/chunk.js';
import { replayGivenUp, type PartitionRebuildOutcome } from '../../../../shared/kafka/replay.js';
import type { Logger } from '../../../../shared/log.js';
import { scopeId, type DetectorOp, type Scope } from '../core/ops.js';
import type { CheckpointLog } from './kafka/checkpoints.js';
import type { RedisDetectorStore } from './redis/store.js';

/**
 * Reads [from ?? earliest, end) of one input partition as ops, in order, batch by batch, while `goOn` holds
 * (else it throws `ReplayStopped`).
 */
export type PartitionReplay = (
  partition: number,
  from: bigint | null,
  end: bigint,
  each: (ops: DetectorOp[], messages: number) => Promise<void>,
  goOn: () => boolean,
) => Promise<void>;

export interface RebuildHooks {
  started(partition: number): void;
  finished(partition: number, outcome: PartitionRebuildOutcome, events: number): void;
}

class LostAgain extends Error {}

const MAX_ATTEMPTS = 5;

/**
 * Redis loss, survived. Each input partition's state is trusted only once it is known to be complete under
 * the current epoch (shared/redis/epoch.ts): `rebuilt` in Redis records, per partition, the epoch it was last
 * rebuilt (or found complete) in. When the marker is gone or replaced, or this partition was never rebuilt
 * in it, the partition's span is replayed from its checkpoint (the first offset of its oldest open task or
 * window record, kept on a Kafka topic) up to the chunk in hand, through the same scripts as live traffic.
 *
 * Why per partition, with no global pause: which records exist depends only on each partition's own
 * sequence, and the window is a function of the set of records (README: "Why the result does not depend on
 * partition interleaving"), so partitions may be replayed independently, by whichever instance owns them,
 * while others flow. A replay that stops halfway is resumed from its checkpoint: what it had applied is
 * then ignored as `duplicate`, as a redelivery is. It stops between batches once the chunk's consumer stops
 * (SIGTERM) or loses the partition (`ctx.isRunning()`): the partition is left unmarked and the chunk
 * uncommitted, and its next owner (this process after a restart, or another instance) rebuilds it.
 */
export class Rebuilder {
  private readonly verified = new Map<number, string>();
  private active = 0;
  /** The epoch whose publication maps this process has restored from the candidates topic. */
  private restoredIn: string | null = null;
  /**
   * The scopes that restore touched, until a rebuild that succeeds returns them for its chunk to publish: one
   * that failed after the restore (its mark, say) left them to the next attempt, which does not restore again.
   */
  private readonly restoredScopes = new Map<string, Scope>();

  constructor(
    private readonly d: {
      store: RedisDetectorStore;
      epoch: Epoch;
      checkpoints: CheckpointLog;
      replay: PartitionReplay;
      /** Puts back the publication maps from the candidates topic; returns the scopes it touched. */
      restorePublished: () => Promise<Scope[]>;
      log: Logger;
      hooks: RebuildHooks;
    },
  ) {}

  isRebuilding(): boolean {
    return this.active > 0;
  }

  /** The chunk just applied saw the state gone: the next `ensure` re-checks the epoch. */
  invalidate(partition: number): void {
    this.verified.delete(partition);
  }

  /**
   * Makes sure `partition`'s state is present before a chunk starting at `end` is applied, rebuilding it when
   * it is not. Returns the epoch to write under and the scopes a rebuild changed (to publish).
   */
  async ensure(
    partition: number,
    end: bigint,
    touch: Scope[],
    ctx: BatchContext,
  ): Promise<{ epoch: string; changed: Scope[] }> {
    const seen = this.verified.get(partition);
    if (seen !== undefined && seen === this.d.epoch.current()) return { epoch: seen, changed: [] };
    for (let attempt = 1; ; attempt++) {
      const { epoch } = await this.d.epoch.check();
      if ((await this.d.store.rebuiltIn(partition)) === epoch) {
        this.verified.set(partition, epoch);
        return { epoch, changed: [] };
      }
      const changed = await this.rebuild(partition, epoch, end, touch, ctx);
      if (changed) return { epoch, changed };
      if (attempt >= MAX_ATTEMPTS)
        throw new PaverError(
          'REDIS_UNAVAILABLE',
          `detector state lost again during ${attempt} rebuild attempts of partition ${partition}`,
        );
    }
  }

  private async rebuild(
    partition: number,
    epoch: string,
    end: bigint,
    touch: Scope[],
    ctx: BatchContext,
  ): Promise<Scope[] | null> {
    const { store, log, hooks } = this.d;
    this.active++;
    hooks.started(partition);
    const t0 = Date.now();
    let events = 0;
    let outcome: PartitionRebuildOutcome = 'failed';
    try {
      // The registry of scopes per partition went with the state: register again as scopes are rebuilt.
      store.forgetScopes();
      const changed = new Map<string, Scope>();
      // What a batch wrote into the emptied Redis before the loss was seen is cleared here (rebuild mode).
      if ((await store.applyBatch([], { epoch, mode: 'r', touch })).lost) {
        outcome = 'retried';
        return null;
      }
      const from = await this.d.checkpoints.get(partition);
      const where = { partition, from: from === null ? 'earliest' : from.toString(), to: end.toString() };
      // A partition's very first batch (offset 0, no checkpoint) has no history to lose: a first start says so
      // quietly; state missing with history before it is worth a warning.
      if (from === null && end === 0n)
        log.info(where, 'detector state for this partition starts here: nothing before it to replay');
      else
        log.warn(
          where,
          'detector state for this partition is not in Redis (lost, or never built in this epoch): replaying it from Kafka',
        );
      try {
        await this.d.replay(
          partition,
          from,
          end,
          async (ops, messages) => {
            const out = await store.applyBatch(ops, { epoch, mode: 'r' });
            if (out.lost) throw new LostAgain();
            for (const s of out.changed) changed.set(scopeId(s), s);
            events += messages;
            await ctx.heartbeat();
          },
          () => ctx.isRunning(),
        );
      } catch (err) {
        if (err instanceof LostAgain) {
          outcome = 'retried';
          return null;
        }
        // A rebalance fails the replay's heartbeat: no failure either, the partition's next owner rebuilds it.
        if (replayGivenUp(err)) {
          outcome = 'stopped';
          log.info(
            where,
            'detector state rebuild stopped (consumer stopping or partition moved): done again by its next owner',
          );
        }
        throw err;
      }
      // Before anything is published in this epoch, so stale candidates get their retraction; and before the
      // mark, which every later process trusts without restoring: one that died between the mark and this
      // restore left the publication maps empty for good (candidates published before the loss never retracted).
      if (this.restoredIn !== epoch) {
        for (const s of await this.d.restorePublished()) this.restoredScopes.set(scopeId(s), s);
        this.restoredIn = epoch;
      }
      await store.markRebuilt(partition, epoch);
      // The marker must still be the one rebuilt under; if not, the state went again meanwhile.
      if ((await this.d.epoch.check()).epoch !== epoch) {
        outcome = 'retried';
        return null;
      }
      for (const [id, s] of this.restoredScopes) changed.set(id, s);
      this.restoredScopes.clear();
      this.verified.set(partition, epoch);
      outcome = 'rebuilt';
      log.info(
        { partition, events, scopes: changed.size, ms: Date.now() - t0 },
        'detector partition state rebuilt from Kafka',
      );
      return [...changed.values()];
    } finally {
      this.active--;
      hooks.finished(partition, outcome, events);
    }
  }
}
