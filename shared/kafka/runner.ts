import { setTimeout as sleep } from 'node:timers/promises';
import type { Consumer, EachBatchPayload, Kafka, KafkaMessage } from 'kafkajs';
import type { Codec } from '../codec.js';
import type { CommonEnv } from '../config.js';
import { classifyError, PaverError, errorMessage, writeRefused } from '../errors.js';
import type { Logger } from '../log.js';
import type { RuntimeMetrics } from '../metrics.js';
import { withRetry } from '../retry.js';
import {
  buildDeadLetter,
  messageBytes,
  isTooLarge,
  MAX_SERVICE_NAME,
  withoutOriginal,
  type DeadLetterSource,
} from './dead-letter.js';
import { batchShare, produceRequests, RECORD_BATCH_OVERHEAD } from './requests.js';
import { processChunk, type BadRecord, type BatchContext, type BatchHandler } from './chunk.js';
import { decodeMessage, decodeMessageSync, type Decoded, type Parser } from './decode.js';
import { createGroupMonitor } from './group-monitor.js';
import type { Sink } from './sink.js';

export type { InboundRecord, Rejection, BatchContext, BatchHandler } from './chunk.js';
export { zodParser, type Parser } from './decode.js';

/** What every consumer needs from the process, built once by runService and passed whole. */
export interface RuntimeDeps {
  env: CommonEnv;
  kafka: Kafka;
  codec: Codec;
  sink: Sink;
  metrics: RuntimeMetrics;
  log: Logger;
  /** Called when the consumer has crashed for good (restarts exhausted or a non-retriable error). */
  onFatal: (err: Error) => void;
  /**
   * The codec's dependency (a schema registry), for consumers that need nothing else, such as the table feeds:
   * while it is down they pause instead of spending their retries and restarts (see RunnerSpec.ready).
   */
  codecWatch?: { ready: () => boolean; transientFailure: (err: PaverError) => void };
}

/** What one consumer is: its group, topics, parser and effect. */
export interface RunnerSpec<T> {
  service: string;
  groupId: string;
  topics: string[];
  fromBeginning?: boolean;
  parse: Parser<T>;
  handler: BatchHandler<T>;
  /** Dependencies the handler needs (Redis); while false, consumption pauses instead of failing batches. */
  ready?: () => boolean;
  /**
   * Told of each transient failure of a chunk, before the runner asks `ready`: where the failure itself says a
   * dependency is down (a Redis command past its deadline), the service marks it so, and the chunk waits.
   */
  transientFailure?: (err: PaverError) => void;
  /** Compacted topics: maps a tombstone (null value) to a typed record; without it a tombstone is dead-lettered. */
  tombstone?: (key: string | null) => T | null;
  /**
   * The record key `topic`'s contract asks for `value` (the tool-calls topic: its session_id), or null for none.
   * A record keyed otherwise (a producer keying by another field, or by nothing) is still processed, and counted
   * in paver_input_key_mismatches_total with a warning: the services keep per-session order and per-partition
   * state, which hold only when one session's events share one partition. Counted each time it is read.
   */
  keyOf?: (value: T, topic: string) => string | null;
  /**
   * Called when a rebalance starts and when this member joins the new generation: partitions may have moved,
   * so what the service keeps of its partitions' state in process (a read cache) may now be written by
   * another instance.
   */
  onRebalance?: () => void;
}

/** The flat form (spec and dependencies in one object) that existing call sites use. */
export type RunnerOptions<T> = RunnerSpec<T> & RuntimeDeps;

export interface Runner {
  start(): Promise<void>;
  /** Finishes the chunk in hand, commits it, leaves the group. Safe to call at any time, more than once. */
  stop(): Promise<void>;
  /** In the group as the broker sees it (the last poll found the group stable with this member), and not rebalancing. */
  isJoined(): boolean;
  /** The last poll of the broker succeeded (within about PAVER_LAG_POLL_MS). */
  brokerReachable(): boolean;
  /** The assignment of this member's last join, kept through a rebalance (the lag metrics read it). */
  assignment(): Record<string, number[]>;
  /**
   * The partitions this member owns now, per topic: from its join until a rebalance starts, or it stops or
   * crashes; null meanwhile (their owner may then be another member). For work on its partitions outside a
   * batch, which must stop when they move.
   */
  owned(): Record<string, number[]> | null;
}

const MAX_KEY_BYTES = 1024;

/** kafkajs error types that mean "this member must rejoin the group" (kafkajs's isRebalancing, plus a lost member id). */
const MEMBERSHIP = new Set([
  'REBALANCE_IN_PROGRESS',
  'NOT_COORDINATOR_FOR_GROUP',
  'ILLEGAL_GENERATION',
  'UNKNOWN_MEMBER_ID',
]);

/**
 * The kafkajs error, anywhere in `err`'s cause chain, saying the group is rebalancing or forgot this member
 * (a heartbeat or a commit during a batch, when another instance joined, left or died). Not a failure of
 * the batch: it stops here, its offsets stay uncommitted, and its partitions are read again by whoever owns
 * them after the rejoin. kafkajs rejoins only when it gets this error back as it threw it.
 */
export function membershipChange(err: unknown): Error | null {
  for (const e of causeChain(err))
    if (typeof e.type === 'string' && MEMBERSHIP.has(e.type)) return e as unknown as Error;
  return null;
}

/** `err`, then what it wraps (`cause`, or kafkajs's `originalError`), a few levels deep. */
function* causeChain(err: unknown): Generator<{ name?: unknown; type?: unknown }> {
  let e = err as { name?: unknown; type?: unknown; cause?: unknown; originalError?: unknown } | undefined;
  for (let i = 0; e && i < 6; i++) {
    yield e;
    e = (e.cause ?? e.originalError) as typeof e;
  }
}

/**
 * kafkajs reports its exhausted retries against an unreachable broker as non-retriable
 * (KafkaJSNumberOfRetriesExceeded wrapping a connection error): for the runner that is an outage to ride out,
 * not a bug.
 */
export function isBrokerOutage(err: unknown): boolean {
  const names =
    /^KafkaJS(ConnectionError|ConnectionClosedError|RequestTimeoutError|BrokerNotFound|NumberOfRetriesExceeded|Lock(Timeout)?|NoBrokerAvailableError)$/;
  for (const e of causeChain(err)) if (typeof e.name === 'string' && names.test(e.name)) return true;
  return false;
}
const DEAD_LETTER_REQUEST_BUDGET = 512 * 1024;

/**
 * The runners paused now, per paver_consumer_paused gauge: a service's table feeds share its metrics (and, with a
 * schema registry, pause too), so each runner writing its own state over the unlabelled gauge let a feed that
 * resumed show 0 while the main consumer still waited for Redis. The gauge says 1 while any of them is paused.
 */
const pausedRunners = new WeakMap<object, Set<object>>();
function showRunnerPaused(gauge: RuntimeMetrics['paused'], runner: object, paused: boolean) {
  let set = pausedRunners.get(gauge);
  if (!set) pausedRunners.set(gauge, (set = new Set()));
  if (paused) set.add(runner);
  else set.delete(runner);
  gauge.set(set.size > 0 ? 1 : 0);
}

const sourceOf = (r: BadRecord<KafkaMessage>): DeadLetterSource => ({
  topic: r.topic,
  partition: r.partition,
  offset: r.msg.offset,
  key: r.msg.key ?? null,
  value: r.msg.value ?? null,
  timestamp: r.msg.timestamp,
  headers: r.msg.headers,
});

/** `createRunner(spec, deps)`, or the flat `createRunner({ ...spec, ...deps })` of earlier call sites. */
export function createRunner<T>(spec: RunnerSpec<T>, deps: RuntimeDeps): Runner;
export function createRunner<T>(o: RunnerOptions<T>): Runner;
export function createRunner<T>(spec: RunnerSpec<T> | RunnerOptions<T>, deps?: RuntimeDeps): Runner {
  const o: RunnerOptions<T> = deps ? { ...spec, ...deps } : (spec as RunnerOptions<T>);
  // Dead letters carry the name: HASH_ONLY_DEAD_LETTER_MAX_BYTES (PAVER_MAX_OUTPUT_BYTES's least) assumes this bound.
  if (!new RegExp(`^[a-zA-Z0-9._-]{1,${MAX_SERVICE_NAME}}$`).test(o.service))
    throw new PaverError('INTERNAL', `service name must be 1 to ${MAX_SERVICE_NAME} of [a-zA-Z0-9._-]`);
  let restarts = 0;
  let joined = false;
  let memberId: string | null = null;
  let assigned: Record<string, number[]> = {};
  let started: Promise<void> | null = null;
  let stopping: Promise<void> | null = null;
  /** The batches being processed: a stop aborts each one's signal (BatchContext.signal). */
  const batchesRunning = new Set<AbortController>();
  /** Next offset to read per partition, once the effects before it are written (committed or not). */
  const processed = new Map<string, Map<number, bigint>>();
  /** Commits owed past records no consumer is given, per `partition\0topic` (see END_BATCH_PROCESS). */
  const owed = new Map<string, { topic: string; partition: number; offset: bigint }>();
  let committing: Promise<void> | null = null;
  /** The partitions of the commit in flight. */
  let inFlight = new Set<string>();
  const markProcessed = (topic: string, partition: number, next: bigint) => {
    let t = processed.get(topic);
    if (!t) processed.set(topic, (t = new Map()));
    if ((t.get(partition) ?? -1n) < next) t.set(partition, next);
  };

  const heartbeatMs = Math.floor(o.env.KAFKA_SESSION_TIMEOUT_MS / 10);
  const consumer: Consumer = o.kafka.consumer({
    groupId: o.groupId,
    sessionTimeout: o.env.KAFKA_SESSION_TIMEOUT_MS,
    rebalanceTimeout: Math.max(60_000, o.env.KAFKA_SESSION_TIMEOUT_MS * 2),
    heartbeatInterval: heartbeatMs,
    maxWaitTimeInMs: o.env.KAFKA_MAX_WAIT_MS,
    maxBytesPerPartition: o.env.KAFKA_MAX_BYTES_PER_PARTITION,
    allowAutoTopicCreation: false,
    retry: {
      retries: 5,
      // Bounded restarts (tulios/kafkajs#852, #1721): past the limit the process exits and its supervisor decides.
      restartOnFailure: async () => ++restarts <= o.env.PAVER_MAX_CONSUMER_RESTARTS,
    },
  });

  const monitor = createGroupMonitor({
    groupId: o.groupId,
    topics: o.topics,
    env: o.env,
    log: o.log,
    metrics: o.metrics,
    memberId: () => memberId,
    assignment: () => assigned,
  });

  consumer.on(consumer.events.GROUP_JOIN, (e) => {
    joined = true;
    owed.clear();
    restarts = 0;
    memberId = e.payload.memberId;
    assigned = e.payload.memberAssignment;
    monitor.poke();
    o.metrics.rebalances.inc();
    o.log.info({ assignment: assigned, groupId: o.groupId }, 'joined consumer group');
    o.onRebalance?.();
  });
  consumer.on(consumer.events.CRASH, (e) => {
    joined = false;
    const restart = e.payload.restart;
    o.metrics.consumerCrashes.inc({ restart: String(restart) });
    o.log.error({ err: e.payload.error.message, restart }, 'consumer crashed');
    if (!restart && !stopping) o.onFatal(e.payload.error);
  });
  consumer.on(consumer.events.REBALANCING, () => {
    joined = false;
    owed.clear();
    o.onRebalance?.();
  });
  consumer.on(consumer.events.STOP, () => (joined = false));
  // A fetch that held only records no consumer is given (the marker ending a transaction, aborted records)
  // never reaches eachBatch: kafkajs moves its position past them, and, with autoCommit off, commits nothing.
  // Committed here, or the group stays one marker short of the end: lag 1 and an oldest-unprocessed age that
  // grows for good, and a table read from such a topic never caught up. Everything before the batch was
  // processed already (the fetch starts where the last commit or resolve left the partition).
  consumer.on(consumer.events.END_BATCH_PROCESS, (e) => {
    const { topic, partition, batchSize, lastOffset, highWatermark } = e.payload;
    if (batchSize !== 0 || stopping) return;
    const next = BigInt(lastOffset) + 1n;
    markProcessed(topic, partition, next);
    reportProcessed(topic, partition, next, BigInt(highWatermark));
    const k = `${partition}\0${topic}`;
    if ((owed.get(k)?.offset ?? -1n) < next) owed.set(k, { topic, partition, offset: next });
    void commitOwed();
  });
  // A commit that failed is owed until one succeeds: tried again at the next fetch (every KAFKA_MAX_WAIT_MS at
  // most, an idle partition included) and at the next batch.
  consumer.on(consumer.events.FETCH, () => {
    if (owed.size > 0) void commitOwed();
  });
  // Partitions may move at a rebalance: whoever owns one next reads its markers again from the committed offset
  // and commits past them itself; a commit owed from before could land after that owner's and set it back.
  // (Cleared at REBALANCING and GROUP_JOIN, above.)

  /**
   * Commits the owed offsets past markers, one commit at a time; never rejects (before, a failed commit was
   * only logged at debug, and the group stayed short of the end for good). A batch of a partition waits for
   * the commit in flight before it commits further, so a late answer cannot set the partition back.
   */
  function commitOwed(): Promise<void> {
    if (committing) return committing;
    const run = async () => {
      while (owed.size > 0 && !stopping) {
        const taken = [...owed.entries()];
        inFlight = new Set(taken.map(([k]) => k));
        try {
          await consumer.commitOffsets(
            taken.map(([, c]) => ({ topic: c.topic, partition: c.partition, offset: c.offset.toString() })),
          );
          for (const [k, c] of taken) if (owed.get(k)?.offset === c.offset) owed.delete(k);
        } catch (err) {
          if (membershipChange(err)) {
            // Rebalancing: the partitions' next owners commit past the markers (REBALANCING clears the rest).
            for (const [k, c] of taken) if (owed.get(k)?.offset === c.offset) owed.delete(k);
            o.log.debug({ err: errorMessage(err) }, 'commit past skipped records left to the rejoin');
          } else {
            for (const [, c] of taken) o.metrics.markerCommitFailures.inc({ topic: c.topic });
            o.log.warn(
              { err: errorMessage(err), partitions: taken.map(([, c]) => `${c.topic}/${c.partition}`) },
              'commit past skipped records (transaction markers) failed; trying again at the next fetch',
            );
          }
          return;
        }
      }
    };
    // `finally` runs after the assignment, even when `run` has nothing to do.
    committing = run()
      .catch(() => undefined)
      .finally(() => {
        committing = null;
        inFlight = new Set();
      });
    return committing;
  }

  function reportProcessed(topic: string, partition: number, next: bigint, hw: bigint) {
    o.metrics.consumerLag.set({ topic, partition: String(partition) }, Number(hw > next ? hw - next : 0n));
    monitor.processed(topic, partition, next, hw);
  }

  /** Mismatched keys since the last warning: one warning a minute at most, with the count (never a key). */
  const mismatches = { count: 0, warnedAt: 0 };
  function keyChecked<D extends Decoded<T> | undefined>(topic: string, msg: KafkaMessage, d: D): D {
    if (!d?.ok || !o.keyOf) return d;
    const want = o.keyOf(d.value, topic);
    if (want === null || (msg.key !== null && msg.key.toString('utf8') === want)) return d;
    o.metrics.keyMismatches.inc({ topic });
    mismatches.count++;
    const now = Date.now();
    if (now - mismatches.warnedAt >= 60_000) {
      o.log.warn(
        { topic, records: mismatches.count },
        'input records not keyed as the contract asks (the tool-calls topic: by session_id); processed, but one session on several partitions breaks its order and per-partition state',
      );
      mismatches.count = 0;
      mismatches.warnedAt = now;
    }
    return d;
  }

  async function deadLetter(records: BadRecord<KafkaMessage>[]) {
    if (records.length === 0) return;
    const now = Date.now();
    const limits = {
      maxOriginalBytes: o.env.PAVER_DEAD_LETTER_MAX_ORIGINAL_BYTES,
      maxKeyBytes: MAX_KEY_BYTES,
    };
    const maxRecordBytes = o.env.PAVER_MAX_OUTPUT_BYTES;
    let stripped = 0;
    const built = records.map((r) => {
      let message = buildDeadLetter(o.service, sourceOf(r), r.reason, r.detail, limits, now);
      // Over the outputs' limit as the broker counts it (original bytes and headers both count): the hash-only
      // record from the start, which a topic whose max.message.bytes is the limit takes: the full one would only be
      // refused, and the broker's refusal is left for topics set under the limit.
      if (messageBytes(message) > maxRecordBytes) {
        message = withoutOriginal(o.service, sourceOf(r), r.reason, r.detail, now);
        stripped++;
      }
      return { r, message };
    });
    const topic = o.env.PAVER_TOPIC_DEAD_LETTERS;
    // Rethrown so the batch is redelivered: a message is never lost because the dead-letter write failed. A write
    // the broker refuses for good (a permission, the topic's configuration) is not retried: the service stops at
    // once, naming the topic and the cause, rather than spend every retry and restart on it first.
    const failed = (
      err: unknown,
      code: 'DEAD_LETTER_WRITE_FAILED' | 'INTERNAL' = 'DEAD_LETTER_WRITE_FAILED',
    ) =>
      (err instanceof PaverError && err.code === 'CONFIG_INVALID' ? err : null) ??
      writeRefused(topic, err) ??
      new PaverError(code, `dead-letter write failed: ${errorMessage(err)}`, { cause: err });
    // Dead letters stay plain JSON even with a registry: they must be readable when the registry is the problem.
    // One produce request per size budget: the broker's limit applies to a partition's whole record batch. Cut
    // as the sink cuts (same shares, same budget), so that each group goes as one request: a refused group was
    // written not at all, and sending its records again one by one writes none twice.
    for (const group of produceRequests(
      built,
      built.map((g) => batchShare(messageBytes(g.message))),
      Math.min(DEAD_LETTER_REQUEST_BUDGET, maxRecordBytes - RECORD_BATCH_OVERHEAD),
    )) {
      try {
        await o.sink.sendRaw(
          topic,
          group.map((g) => g.message),
        );
      } catch (err) {
        if (!isTooLarge(err)) throw failed(err);
        // The broker's limit is below ours: no retry can change that. Each record alone, then, with its original
        // bytes where it fits (the group's others need not lose theirs), else with the hash and position only.
        for (const { r, message } of group) {
          if (group.length > 1) {
            try {
              await o.sink.sendRaw(topic, [message]);
              continue;
            } catch (e1) {
              if (!isTooLarge(e1)) throw failed(e1);
            }
          }
          const small = withoutOriginal(o.service, sourceOf(r), r.reason, r.detail, now);
          try {
            await o.sink.sendRaw(topic, [small]);
          } catch (e2) {
            throw failed(e2, isTooLarge(e2) ? 'INTERNAL' : 'DEAD_LETTER_WRITE_FAILED');
          }
          stripped++;
        }
      }
    }
    for (const r of records) {
      o.metrics.deadLetters.inc({ reason: r.reason });
      o.metrics.eventsConsumed.inc({ topic: r.topic, outcome: 'dead_lettered' });
    }
    o.log.warn(
      {
        count: records.length,
        reasons: [...new Set(records.map((r) => r.reason))],
        topic: records[0]?.topic,
        ...(stripped ? { withoutOriginal: stripped } : {}),
      },
      'messages dead-lettered',
    );
  }

  const decodeOptions = {
    codec: o.codec,
    parse: o.parse,
    tombstone: o.tombstone,
    maxBytes: o.env.PAVER_MAX_MESSAGE_BYTES,
  };

  /**
   * After leaving the group, reads the group's offsets back from the broker and commits any processed
   * partition still behind (a commit lost to a rebalance or a timeout during the stop). Only forward, and
   * only while the group is empty (setOffsets refuses otherwise): a partition another member now owns is
   * left to it, and at-least-once still holds.
   */
  async function ensureCommitted() {
    if (processed.size === 0) return;
    const admin = o.kafka.admin();
    try {
      await admin.connect();
      for (const [topic, parts] of processed) {
        const [committed] = await admin.fetchOffsets({ groupId: o.groupId, topics: [topic] });
        const behind = [...parts]
          .filter(([partition, next]) => {
            const c = committed?.partitions.find((x) => x.partition === partition)?.offset ?? '-1';
            return BigInt(c) < next;
          })
          .map(([partition, next]) => ({ partition, offset: next.toString() }));
        if (behind.length === 0) continue;
        await admin.setOffsets({ groupId: o.groupId, topic, partitions: behind });
        o.log.warn({ topic, partitions: behind.map((b) => b.partition) }, 'committed offsets on stop');
      }
    } catch (err) {
      o.log.warn({ err: errorMessage(err) }, 'could not verify committed offsets on stop');
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }

  /** Waits (checking every 200 ms, `each` between checks) until the dependencies are ready or `goOn` says stop. */
  async function untilReady(goOn: () => boolean, each?: () => Promise<void>): Promise<void> {
    while (!(o.ready?.() ?? true) && goOn()) {
      await each?.();
      await sleep(200);
    }
  }

  let backpressure: Promise<void> | null = null;
  /** Chunks waiting in `hold` now: with partitions consumed concurrently, several at once. */
  let holding = 0;
  /** The gauge says paused while consumption is paused or any chunk waits for its dependency. */
  const me = {};
  const showPaused = () => showRunnerPaused(o.metrics.paused, me, !!backpressure || holding > 0);
  function pauseUntilReady(pause: () => () => void) {
    const resume = pause();
    showRunnerPaused(o.metrics.paused, me, true);
    if (backpressure) return;
    o.log.warn('dependency not ready: pausing consumption');
    backpressure = (async () => {
      await untilReady(() => !stopping);
      backpressure = null;
      showPaused();
      o.log.info('dependency ready: resuming consumption');
      resume();
      try {
        consumer.resume(o.topics.map((topic) => ({ topic })));
      } catch (err) {
        // A consumer stopped, or crashed and not yet restarted, has no group to resume (kafkajs throws), and the
        // group it starts with is not paused. Uncaught, this rejection ended the process (exit 1): in a stop, or
        // when Redis came back before the broker did.
        o.log.debug({ err: errorMessage(err) }, 'nothing to resume: the consumer is stopped or restarting');
      }
    })();
  }

  async function eachBatch(p: EachBatchPayload) {
    const { batch } = p;
    const { topic, partition } = batch;
    if (!p.isRunning() || p.isStale()) return;
    // This batch's commits cover what the partition owes past markers (it starts past them). A commit of it in
    // flight is waited for, or its late answer could set the partition back; the other partitions' owed
    // commits are tried again meanwhile.
    const key = `${partition}\0${topic}`;
    owed.delete(key);
    if (inFlight.has(key)) await committing;
    else if (owed.size > 0) void commitOwed();
    if (o.ready && !o.ready()) return pauseUntilReady(p.pause);

    const endTimer = o.metrics.processingSeconds.startTimer({ topic });
    // A batch that fails is timed too (a stuck dependency shows as slow failed batches, not as no batches); one
    // cut short by a stop or a rebalance is `stopped`, neither a whole batch nor a failure.
    let outcome: 'ok' | 'failed' | 'stopped' = 'ok';
    /**
     * The group's rebalance (or this member's loss), as the heartbeat timer met it during a chunk: no new work of
     * the batch starts (the handler is told through ctx.isRunning, no retry runs), and it goes back to kafkajs.
     */
    let rejoin: Error | null = null;
    // Aborted with the batch's new work (a stop, the partition's loss, the group's rebalance): a step waiting on
    // something slow stops waiting. A model call per record would otherwise go on for its whole budget, record
    // after record: a stop would wait past PAVER_SHUTDOWN_TIMEOUT_MS (exit 1), and a rebalance hold the group.
    const abort = new AbortController();
    batchesRunning.add(abort);
    if (stopping) abort.abort();
    try {
      const ctx: BatchContext = {
        heartbeat: () => p.heartbeat(),
        isRunning: () => p.isRunning() && !p.isStale() && !rejoin && !abort.signal.aborted,
        signal: abort.signal,
      };
      const retry = {
        attempts: o.env.PAVER_RETRY_ATTEMPTS,
        initialMs: o.env.PAVER_RETRY_INITIAL_MS,
        maxMs: o.env.PAVER_RETRY_MAX_MS,
        shouldStop: () => !p.isRunning() || rejoin !== null,
        onRetry: async (err: PaverError, attempt: number, waitMs: number) => {
          o.metrics.retries.inc({ code: err.code });
          o.log.warn(
            { code: err.code, err: err.message, attempt, waitMs, topic, partition },
            'retrying batch chunk',
          );
          await p.heartbeat().catch((e: unknown) => {
            // The group is rebalancing: the attempts left would hold every member of the group for the whole
            // backoff (and past the rebalance timeout, this one out of it). The chunk stays uncommitted.
            const rejoin = membershipChange(e);
            if (rejoin) throw rejoin;
          });
        },
        hold: async (err: PaverError) => {
          o.transientFailure?.(err);
          if (!o.ready || o.ready()) return false;
          o.metrics.retries.inc({ code: err.code });
          holding++;
          showPaused();
          o.log.warn(
            { code: err.code, err: err.message, topic, partition },
            'retrying batch chunk once its dependency is ready',
          );
          // Heartbeats keep the assignment (kafkajs sends one per heartbeat interval at most); one that fails (a
          // rebalance) ends the batch, uncommitted, as any failure would.
          try {
            await untilReady(
              () => p.isRunning() && !p.isStale() && !stopping && !rejoin,
              () => p.heartbeat(),
            );
          } finally {
            holding--;
            showPaused();
          }
          // Cut short by a stop or a rebalance, the failure counts as an attempt (and the stop then ends it).
          return o.ready();
        },
      };

      const messages = batch.messages;
      // Past the last message kafkajs gives, a batch may hold records no consumer is given (transaction markers,
      // aborted records): the last chunk commits past them too, or the group would stay short of the end for good.
      const batchEnd = BigInt(batch.lastOffset()) + 1n;
      /** Where the partition is committed to by this batch so far (a batch cut short reports its lag from there). */
      let reached: bigint | null = null;
      for (let i = 0; i < messages.length; i += o.env.PAVER_BATCH_CHUNK) {
        const chunk = messages.slice(i, i + o.env.PAVER_BATCH_CHUNK);
        monitor.processing(topic, partition, Number(chunk[0]!.timestamp));
        // kafkajs heartbeats only when asked. An effect longer than the session timeout (a model call per
        // request, a slow Redis) that does not ask would get the member evicted: its commit refused, the chunk
        // read again, as slowly, for good. A heartbeat that finds the group rebalancing stops the batch's new
        // work (ctx.isRunning says so to the handler, retries end) and the batch then hands it to kafkajs; dropped,
        // it would let a handler working in steps go on to the end of the chunk.
        const beat = setInterval(() => {
          if (!p.isRunning() || p.isStale()) abort.abort();
          void p.heartbeat().catch((e: unknown) => {
            rejoin ??= membershipChange(e);
            if (rejoin) abort.abort();
          });
        }, heartbeatMs);
        let r: Awaited<ReturnType<typeof processChunk>>;
        try {
          r = await processChunk<T, KafkaMessage>({
            topic,
            partition,
            chunk,
            decode: (msg) => keyChecked(topic, msg, decodeMessageSync(msg, topic, decodeOptions)),
            decodeAsync: async (msg) =>
              keyChecked(topic, msg, await decodeMessage(msg, topic, decodeOptions)),
            handler: o.handler,
            ctx,
            retry: (fn) => withRetry(fn, retry),
            deadLetter,
          });
        } finally {
          clearInterval(beat);
        }
        if (r.processed > 0) o.metrics.eventsConsumed.inc({ topic, outcome: 'processed' }, r.processed);

        // Effects are written: now, and only now, the offsets may be committed.
        const afterChunk = BigInt(chunk[chunk.length - 1]!.offset) + 1n;
        const next =
          i + o.env.PAVER_BATCH_CHUNK >= messages.length && batchEnd > afterChunk ? batchEnd : afterChunk;
        markProcessed(topic, partition, next);
        reached = next;
        await p.commitOffsetsIfNecessary({
          topics: [{ topic, partitions: [{ partition, offset: next.toString() }] }],
        });
        // Only once committed: kafkajs fetches again from the resolved offset after a failure that is not a
        // rebalance (a timeout, a coordinator moving). Resolved before a commit that then failed, the chunk was
        // neither read again nor committed: an idle partition kept that lag for good, and a table feed, which
        // counts itself read from its commits, never caught up.
        p.resolveOffset((next - 1n).toString());
        await p.heartbeat();
        if (!p.isRunning() || p.isStale()) {
          if (i + o.env.PAVER_BATCH_CHUNK < messages.length) outcome = 'stopped';
          break;
        }
      }
      if (reached !== null) reportProcessed(topic, partition, reached, BigInt(batch.highWatermark));
    } catch (err) {
      // The timer met a rebalance: what failed or gave up since is not a failure of the batch. It stays
      // uncommitted, and kafkajs, given the rebalance back, rejoins.
      if (rejoin) {
        outcome = 'stopped';
        throw rejoin;
      }
      // An effect that gave up because this consumer is stopping or lost the partition (a rebuild's replay,
      // shared/kafka/replay.ts): not a failure, and not fatal. The chunk stays uncommitted: the partition's next
      // owner, or this service's next start, reads it again.
      if (
        classifyError(err).code === 'SHUTTING_DOWN' &&
        (abort.signal.aborted || !p.isRunning() || p.isStale())
      ) {
        outcome = 'stopped';
        o.log.info(
          { topic, partition },
          'batch stopped by the stop or a rebalance: its uncommitted records are read again',
        );
        return;
      }
      outcome = membershipChange(err) ? 'stopped' : 'failed';
      throw err;
    } finally {
      batchesRunning.delete(abort);
      endTimer({ outcome });
    }
  }

  return {
    isJoined: () => joined && monitor.groupStable(),
    brokerReachable: () => monitor.brokerReachable(),
    assignment: () => assigned,
    owned: () => (joined ? assigned : null),
    start() {
      monitor.start();
      const join = async () => {
        await consumer.connect();
        for (const topic of o.topics)
          await consumer.subscribe({ topic, fromBeginning: o.fromBeginning ?? true });
        await consumer.run({
          autoCommit: false,
          eachBatchAutoResolve: false,
          partitionsConsumedConcurrently: o.env.KAFKA_PARTITIONS_CONSUMED_CONCURRENTLY,
          eachBatch: async (p) => {
            try {
              await eachBatch(p);
            } catch (err) {
              const rejoin = membershipChange(err);
              if (rejoin) {
                o.log.warn(
                  { err: rejoin.message, topic: p.batch.topic, partition: p.batch.partition },
                  'group membership changing: batch stopped, its uncommitted records are read again after the rejoin',
                );
                throw rejoin;
              }
              const e = classifyError(err);
              o.log.error(
                { code: e.code, err: e.message, topic: p.batch.topic, partition: p.batch.partition },
                'batch failed',
              );
              // A bug or a state conflict will not heal by redelivery: stop the process, let its supervisor decide.
              // A broker outage will: kafkajs restarts the consumer (bounded by PAVER_MAX_CONSUMER_RESTARTS).
              if (!e.retriable && !isBrokerOutage(err)) o.onFatal(e);
              // Rethrow: offsets stay uncommitted and the client redelivers after its restart. An outage goes
              // back as kafkajs's own error, whose restart rule knows it (our INTERNAL would stop the consumer).
              throw isBrokerOutage(err) ? err : e;
            }
          },
        });
      };
      // A topic created a moment ago (by this or another service) may have no leader yet: retry the join.
      const attempt = async () => {
        try {
          await join();
        } catch (err) {
          await consumer.disconnect().catch(() => undefined);
          // kafkajs reports its own exhausted retries as non-retriable; at start-up, on a broker still settling
          // ("does not host this topic-partition"), every failure is worth the next bounded attempt.
          throw new PaverError('KAFKA_UNAVAILABLE', `consumer start failed: ${errorMessage(err)}`, {
            cause: err,
          });
        }
      };
      started = withRetry(attempt, {
        attempts: 8,
        initialMs: 250,
        maxMs: 4000,
        shouldStop: () => stopping !== null,
        onRetry: (err, n, waitMs) =>
          o.log.warn({ err: err.message, attempt: n, waitMs }, 'consumer start failed; retrying'),
      });
      return started;
    },
    stop() {
      stopping ??= (async () => {
        for (const a of batchesRunning) a.abort();
        // Disconnecting before run() resolved crashes kafkajs (tulios/kafkajs#1639): wait for start first.
        await started?.catch(() => undefined);
        await consumer.disconnect();
        await monitor.stop();
        await ensureCommitted();
      })();
      return stopping;
    },
  };
}
