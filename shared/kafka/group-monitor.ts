import { Kafka, logLevel, type Admin } from 'kafkajs';
import type { CommonEnv } from '../config.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import type { RuntimeMetrics } from '../metrics.js';
import { kafkaConfig } from './client.js';

/**
 * Asks the broker, every PAVER_LAG_POLL_MS, what the consumer cannot see from inside its fetch loop: whether
 * the broker answers, whether the group is stable with this member in it, and each assigned partition's lag
 * (high watermark minus the group's committed offset). A stalled partition fetches nothing, so lag computed
 * at the end of a batch would stay at its last value; this one grows.
 */
export interface GroupMonitor {
  start(): void;
  /** Polls now (after a join, so readiness does not wait a whole interval). */
  poke(): void;
  stop(): Promise<void>;
  /** The last poll reached the broker. */
  brokerReachable(): boolean;
  /** The last poll saw the group stable with this member in it. */
  groupStable(): boolean;
  /** The first message of a chunk about to be processed: its timestamp is the oldest unprocessed event's. */
  processing(topic: string, partition: number, timestampMs: number): void;
  /** A partition processed up to `next`, its high watermark being `high` as of the fetch. */
  processed(topic: string, partition: number, next: bigint, high: bigint): void;
}

export function createGroupMonitor(o: {
  groupId: string;
  topics: string[];
  env: CommonEnv;
  log: Logger;
  metrics: RuntimeMetrics;
  memberId: () => string | null;
  assignment: () => Record<string, number[]>;
  /** The admin client to poll with; the default is the monitor's own (tests pass one they control). */
  admin?: () => Pick<
    Admin,
    'connect' | 'disconnect' | 'describeGroups' | 'fetchTopicOffsets' | 'fetchOffsets'
  >;
}): GroupMonitor {
  const interval = o.env.PAVER_LAG_POLL_MS;
  // Its own client with short timeouts and few, quick retries: a poll that cannot reach the broker must fail
  // within about one interval, not after the main client's minute of retries. (Zero retries would never load
  // the broker pool: kafkajs fills it on the retry after "No brokers in the broker pool".)
  const kafka = new Kafka({
    ...kafkaConfig(o.env, o.log, `${o.env.KAFKA_CLIENT_ID}-monitor`),
    connectionTimeout: Math.min(3_000, interval),
    requestTimeout: Math.max(1_000, Math.min(10_000, interval * 2)),
    retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 500 },
    // Its failures are this module's to report, once per outage, not kafkajs's once per request.
    logLevel: logLevel.NOTHING,
  });
  const newAdmin = o.admin ?? (() => kafka.admin());
  let admin: ReturnType<typeof newAdmin> | null = null;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;
  let stopped = false;
  let reachable = false;
  let stable = false;
  let failures = 0;
  /** Per "topic\0partition": event time (ms) of the oldest message known to be unprocessed. */
  const oldest = new Map<string, number>();
  const k = (topic: string, partition: number) => `${topic}\0${partition}`;
  /**
   * Per "topic\0partition": the report count when the runner last set that partition's figures. A poll reads
   * committed offsets before the runner's next commit and may answer after it; its figures are then older
   * than the runner's and must not overwrite them (a finished partition would read its whole backlog as lag
   * until the next poll).
   */
  let reports = 0;
  const reportedAt = new Map<string, number>();
  const reported = new Set<string>();

  async function poll() {
    let answered = false;
    const begun = reports;
    try {
      if (!admin) {
        admin = newAdmin();
        await admin.connect();
      }
      const groups = await admin.describeGroups([o.groupId]);
      const g = groups.groups[0];
      const me = o.memberId();
      stable = g?.state === 'Stable' && me !== null && g.members.some((m) => m.memberId === me);
      // The broker answered: what follows (a topic deleted under us, say) is not an unreachable broker.
      answered = true;
      if (!reachable) o.log.info({ groupId: o.groupId }, 'broker reachable');
      reachable = true;
      const assigned = o.assignment();
      const now = Date.now();
      const seen = new Set<string>();
      for (const topic of o.topics) {
        const mine = assigned[topic] ?? [];
        if (mine.length === 0) continue;
        const [ends, committedAll] = await Promise.all([
          admin.fetchTopicOffsets(topic),
          admin.fetchOffsets({ groupId: o.groupId, topics: [topic] }),
        ]);
        const committed = committedAll[0]?.partitions ?? [];
        for (const partition of mine) {
          const end = ends.find((e) => e.partition === partition);
          if (!end) continue;
          const c = BigInt(committed.find((x) => x.partition === partition)?.offset ?? '-1');
          // No commit yet: the group starts from the log start (runners read from the beginning).
          const from = c >= 0n ? c : BigInt(end.low);
          const lag = BigInt(end.high) > from ? BigInt(end.high) - from : 0n;
          const key = k(topic, partition);
          seen.add(key);
          const labels = { topic, partition: String(partition) };
          // The runner reported this partition after the poll began: its lag is the fresher one.
          if ((reportedAt.get(key) ?? -1) < begun) {
            if (lag === 0n) oldest.delete(key);
            // Not fetched yet (a stall, a pause): the first time we saw it behind is a lower bound of its age.
            else if (!oldest.has(key)) oldest.set(key, now);
            o.metrics.consumerLag.set(labels, Number(lag));
          }
          const since = oldest.get(key);
          o.metrics.oldestUnprocessedAge.set(
            labels,
            since === undefined ? 0 : Math.max(0, now - since) / 1000,
          );
        }
      }
      // Partitions moved to another member: their figures are that member's to report now. One assigned since
      // this poll read the assignment (reported by the runner meanwhile) is still this member's.
      const nowAssigned = o.assignment();
      for (const key of reported) {
        if (seen.has(key)) continue;
        const [topic, partition] = key.split('\0') as [string, string];
        if ((nowAssigned[topic] ?? []).includes(Number(partition))) continue;
        o.metrics.consumerLag.remove({ topic, partition });
        o.metrics.oldestUnprocessedAge.remove({ topic, partition });
        oldest.delete(key);
        reportedAt.delete(key);
        reported.delete(key);
      }
      for (const key of seen) reported.add(key);
      failures = 0;
    } catch (err) {
      if (failures++ === 0) {
        o.log.warn(
          { err: errorMessage(err), groupId: o.groupId, brokerAnswered: answered },
          answered ? 'group monitor could not read lag' : 'broker not reachable from the group monitor',
        );
      }
      if (answered) return;
      reachable = false;
      stable = false;
      const a = admin;
      admin = null;
      await a?.disconnect().catch(() => undefined);
    }
  }

  // A poke that finds a poll in flight (a join during a poll) must not be lost: that poll may have read the
  // assignment or the group before the join, and readiness and lag would then wait a whole interval.
  let pokedMeanwhile = false;
  const tick = () => {
    if (stopped || running) return;
    running = poll().finally(() => {
      running = null;
      if (pokedMeanwhile) {
        pokedMeanwhile = false;
        tick();
      }
    });
  };
  const poke = () => {
    if (running) pokedMeanwhile = true;
    else tick();
  };

  return {
    start() {
      if (timer || stopped) return;
      timer = setInterval(tick, interval);
      timer.unref();
      tick();
    },
    poke,
    async stop() {
      stopped = true;
      if (timer) clearInterval(timer);
      await running;
      await admin?.disconnect().catch(() => undefined);
    },
    brokerReachable: () => reachable,
    groupStable: () => stable,
    processing(topic, partition, ts) {
      if (Number.isFinite(ts)) oldest.set(k(topic, partition), ts);
    },
    processed(topic, partition, next, high) {
      const key = k(topic, partition);
      reportedAt.set(key, reports++);
      // Exported from now on, so a poll removes it once the partition moves away, even if no poll saw it here.
      reported.add(key);
      // The runner sets the lag gauge at the same moment: keep the two consistent between polls.
      if (next >= high) {
        oldest.delete(key);
        o.metrics.oldestUnprocessedAge.set({ topic, partition: String(partition) }, 0);
      }
      // More is waiting, not yet fetched: now is a lower bound until its chunk starts.
      else oldest.set(key, Date.now());
    },
  };
}
