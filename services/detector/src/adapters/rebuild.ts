import type { Epoch } from '../../../../shared/redis/epoch.js';
import { errorMessage, PaverError } from '../../../../shared/errors.js';
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

/** What called for a rebuild: a batch of the partition, or a pass over the partitions this instance owns. */
export type RebuildTrigger = 'batch' | 'proactive';

export interface RebuildHooks {
  started(partition: number, trigger: RebuildTrigger): void;
  finished(
    partition: number,
    outcome: PartitionRebuildOutcome,
    events: number,
    trigger: RebuildTrigger,
  ): void;
}

/** What a rebuild of the partitions this instance owns needs beyond a batch's (`Rebuilder.rebuildOwned`). */
export interface OwnedPartitions {
  /** The input partitions this instance owns now; null while it is not in its group (Runner.owned). */
  owned: () => number[] | null;
  /** The group's committed offset of `partition`, or null when none is. */
  committed: (partition: number) => Promise<bigint | null>;
  /** Publishes the scopes a rebuild changed, as a batch does. */
  publish: (scopes: Scope[]) => Promise<void>;
  /** False once the service stops. */
  isRunning: () => boolean;
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
 *
 * A partition with no traffic gets no batch to call for its rebuild: its state stayed missing after a loss, and the
 * sweep (which acts only on scopes rebuilt in the current epoch) never retired its idle scopes. So when a check
 * of the epoch finds it changed, at a join, and once a minute, `rebuildOwned` rebuilds every partition this
 * instance owns that is not rebuilt in the current epoch, up to where its group has consumed it. One partition's
 * batches and rebuilds run one at a time (`exclusive`): a rebuild that read the committed offset while a batch of
 * the partition was being applied would end short of that batch, and the mark would then hide the gap for good.
 */
export class Rebuilder {
  private readonly verified = new Map<number, string>();
  /** Per partition, the next offset after the last chunk this process applied (a commit may lag behind it). */
  private readonly appliedTo = new Map<number, bigint>();
  private readonly holders = new Map<number, Promise<unknown>>();
  /**
   * Per partition, the batches waiting for it (`exclusive`). Once one of them is told to stop (its group
   * rebalancing, the partition revoked, the service stopping), a rebuild of the partition by the pass gives up:
   * kafkajs rejoins only after every batch in hand returns, and this member's `owned` changes only at that
   * rejoin, so the pass alone would hold the whole group's rebalance until its replay ended.
   */
  private readonly waiters = new Map<number, Set<BatchContext>>();
  private active = 0;
  /** The epoch the last pass over the owned partitions was started for by an epoch check. */
  private passedIn: string | null = null;
  private pass: Promise<void> | null = null;
  private passAgain = false;
  private closed = false;
  private timer: NodeJS.Timeout | null = null;
  /** The epoch whose publication maps this process has restored from the candidates topic. */
  private restoredIn: string | null = null;
  /**
   * The scopes that restore touched, until a rebuild that succeeds returns them for its chunk to publish: one
   * that failed after the restore (its mark, say) left them to the next attempt, which does not restore again.
   */
  private readonly restoredScopes = new Map<string, Scope>();
  /** The restore running now: rebuilds of two partitions at once (a batch's, the pass's) read the topic once. */
  private restoring: { epoch: string; done: Promise<void> } | null = null;

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
      /** Without it (tests of the batch path), only batches rebuild. */
      owned?: OwnedPartitions;
    },
  ) {}

  isRebuilding(): boolean {
    return this.active > 0;
  }

  /** The chunk just applied saw the state gone: the next `ensure` re-checks the epoch. */
  invalidate(partition: number): void {
    this.verified.delete(partition);
  }

  /** A chunk of `partition` ending before `next` is applied: a rebuild of the partition replays up to there at least. */
  noteApplied(partition: number, next: bigint): void {
    if ((this.appliedTo.get(partition) ?? -1n) < next) this.appliedTo.set(partition, next);
  }

  /**
   * Runs `fn` once no other batch or rebuild of `partition` runs, and holds the partition until it ends. A batch
   * passes its context as `waiter`: a rebuild by the pass that it waits for stops once the batch is told to stop.
   */
  async exclusive<T>(partition: number, fn: () => Promise<T>, waiter?: BatchContext): Promise<T> {
    let waiting = this.waiters.get(partition);
    if (waiter) {
      if (!waiting) this.waiters.set(partition, (waiting = new Set()));
      waiting.add(waiter);
    }
    const unwait = () => {
      if (!waiter || !waiting?.delete(waiter)) return;
      if (waiting.size === 0 && this.waiters.get(partition) === waiting) this.waiters.delete(partition);
    };
    const run = (this.holders.get(partition) ?? Promise.resolve()).then(() => {
      unwait();
      return fn();
    });
    const done = run.catch(() => undefined);
    this.holders.set(partition, done);
    try {
      return await run;
    } finally {
      unwait();
      if (this.holders.get(partition) === done) this.holders.delete(partition);
    }
  }

  /** A batch waiting for `partition` has been told to stop. */
  private waiterStopped(partition: number): boolean {
    for (const w of this.waiters.get(partition) ?? []) if (!w.isRunning()) return true;
    return false;
  }

  /**
   * Makes sure `partition`'s state is present before a chunk starting at `end` is applied, rebuilding it when
   * it is not. Returns the epoch to write under and the scopes a rebuild changed (to publish). The caller holds
   * the partition (`exclusive`).
   */
  async ensure(
    partition: number,
    end: bigint,
    touch: Scope[],
    ctx: BatchContext,
    trigger: RebuildTrigger = 'batch',
  ): Promise<{ epoch: string; changed: Scope[] }> {
    const seen = this.verified.get(partition);
    if (seen !== undefined && seen === this.d.epoch.current()) return { epoch: seen, changed: [] };
    for (let attempt = 1; ; attempt++) {
      const { epoch } = await this.checkEpoch();
      // The state may be gone for the partitions this instance owns that get no batch: they are rebuilt too,
      // beside this one (each waits for its own partition's batch, if one is running).
      if (epoch !== this.passedIn) {
        this.passedIn = epoch;
        void this.rebuildOwned();
      }
      if ((await this.d.store.rebuiltIn(partition)) === epoch) {
        this.verified.set(partition, epoch);
        return { epoch, changed: [] };
      }
      const changed = await this.rebuild(partition, epoch, end, touch, ctx, trigger);
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
    trigger: RebuildTrigger,
  ): Promise<Scope[] | null> {
    const { store, log, hooks } = this.d;
    this.active++;
    hooks.started(partition, trigger);
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
      const where = {
        partition,
        from: from === null ? 'earliest' : from.toString(),
        to: end.toString(),
        trigger,
      };
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
      if (this.restoredIn !== epoch) await this.restoreOnce(epoch);
      await store.markRebuilt(partition, epoch);
      // The marker must still be the one rebuilt under; if not, the state went again meanwhile.
      if ((await this.checkEpoch()).epoch !== epoch) {
        outcome = 'retried';
        return null;
      }
      for (const [id, s] of this.restoredScopes) changed.set(id, s);
      this.restoredScopes.clear();
      this.verified.set(partition, epoch);
      outcome = 'rebuilt';
      log.info(
        { partition, events, scopes: changed.size, ms: Date.now() - t0, trigger },
        'detector partition state rebuilt from Kafka',
      );
      return [...changed.values()];
    } finally {
      this.active--;
      hooks.finished(partition, outcome, events, trigger);
    }
  }

  private restoreOnce(epoch: string): Promise<void> {
    if (this.restoring?.epoch !== epoch) {
      const done = this.d.restorePublished().then((scopes) => {
        for (const s of scopes) this.restoredScopes.set(scopeId(s), s);
        this.restoredIn = epoch;
      });
      this.restoring = { epoch, done };
      // One that failed is tried again by the next rebuild that needs it.
      done.catch(() => {
        if (this.restoring?.done === done) this.restoring = null;
      });
    }
    return this.restoring.done;
  }

  /**
   * Rebuilds every partition this instance owns that is not rebuilt (or found complete) in the current epoch, up
   * to the end of what its group consumed: the committed offset, or further if this process applied more. The
   * records past it come as batches, and are applied as any batch is. A partition nothing was consumed of is
   * left to its first batch. One pass at a time; a call during one runs another after it. Never rejects: a
   * partition that failed is tried again by the next pass or by its next batch. Cheap when nothing changed (one
   * epoch read).
   */
  rebuildOwned(): Promise<void> {
    if (!this.d.owned || this.closed) return Promise.resolve();
    if (this.pass) {
      this.passAgain = true;
      return this.pass;
    }
    this.pass = (async () => {
      try {
        do {
          this.passAgain = false;
          await this.passOwned(this.d.owned!);
        } while (this.passAgain && !this.closed);
      } finally {
        this.pass = null;
      }
    })();
    return this.pass;
  }

  /** `rebuildOwned` every `ms` until `close`: a loss no check of this instance has seen yet is found within `ms`. */
  rebuildOwnedEvery(ms: number): void {
    this.timer = setInterval(() => void this.rebuildOwned(), ms);
    this.timer.unref();
  }

  /** Stops the passes: one running gives up its replay between two fetches, and is waited for. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    await this.pass;
  }

  /** The marker's check, one round trip on the store's connection: counted with the store's own. */
  private checkEpoch() {
    return this.d.store.counted(this.d.epoch.check());
  }

  private async passOwned(o: OwnedPartitions): Promise<void> {
    const { log } = this.d;
    const mine = o.owned();
    if (!mine?.length || !o.isRunning()) return;
    let epoch: string;
    try {
      ({ epoch } = await this.checkEpoch());
    } catch (err) {
      log.warn({ err: errorMessage(err) }, 'owned partitions not checked for a rebuild: trying again later');
      return;
    }
    this.passedIn = epoch;
    // A partition whose batch runs now is rebuilt by that batch if need be: the others first, not after it.
    const order = [...mine].sort((a, b) => Number(this.holders.has(a)) - Number(this.holders.has(b)));
    for (const partition of order) {
      if (this.verified.get(partition) === epoch) continue;
      const owns = () =>
        !this.closed &&
        o.isRunning() &&
        (o.owned()?.includes(partition) ?? false) &&
        !this.waiterStopped(partition);
      if (!owns()) continue;
      try {
        await this.exclusive(partition, async () => {
          if (!owns()) return;
          // A batch of the partition may have rebuilt it, or found it complete, while this waited for it (a newer
          // epoch than this pass's is seen by `ensure`, which starts another pass).
          if (this.verified.get(partition) === epoch) return;
          if ((await this.d.store.rebuiltIn(partition)) === epoch) {
            this.verified.set(partition, epoch);
            return;
          }
          const committed = await o.committed(partition);
          const applied = this.appliedTo.get(partition) ?? null;
          const end = committed === null || (applied !== null && applied > committed) ? applied : committed;
          if (end === null) return;
          const ctx: BatchContext = { heartbeat: () => Promise.resolve(), isRunning: owns };
          const { changed } = await this.ensure(partition, end, [], ctx, 'proactive');
          if (changed.length > 0) await o.publish(changed);
        });
      } catch (err) {
        if (replayGivenUp(err)) continue;
        log.warn(
          { partition, err: errorMessage(err), trigger: 'proactive' },
          'rebuild of an owned partition failed: tried again by the next pass, or by its next batch',
        );
      }
    }
  }
}
