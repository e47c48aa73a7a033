import { randomUUID } from 'node:crypto';
import { errorMessage, PaverError } from '../errors.js';
import { withRetry } from '../retry.js';
import { createRunner, type Parser, type Rejection, type Runner, type RuntimeDeps } from './runner.js';

export interface TableFeed {
  start(): Promise<void>;
  /**
   * Resolves true once everything on the topic when asked has been applied (false after `timeoutMs`; the poll goes
   * on). Every call looks at the topic's end again: a rebuild from the table after start-up needs what was written
   * since, which the feed may not have read yet.
   */
  caughtUp(timeoutMs: number): Promise<boolean>;
  isCaughtUp(): boolean;
  stop(): Promise<void>;
}

/** A record the table rejects (its schema does not compile, its steps are inconsistent…): dead-lettered, nothing changed. */
export class TableRejection extends Error {}

/**
 * A compacted topic read whole by every instance into memory (tool catalogs, orchestration configs, flows):
 * its own throwaway consumer group from the beginning, so each instance holds the full table. Invalid
 * records and records the table rejects go to the dead-letter topic; the table in force stays as it was.
 */
export interface TableFeedSpec<T> {
  service: string;
  topic: string;
  groupPrefix: string;
  parse: Parser<T>;
  /** Applies one record; throws TableRejection to refuse it. */
  apply: (value: T, key: string | null) => void;
  /** Maps a tombstone to a record; null dead-letters it. */
  tombstone?: (key: string | null) => T | null;
  onApplied?: (outcome: 'applied' | 'rejected', n: number) => void;
}

/** Where a service's table lives: what its feed wrapper (catalog, orchestration, flows…) takes from `main.ts`. */
export type TablePlace = Pick<TableFeedSpec<unknown>, 'topic' | 'groupPrefix' | 'onApplied'>;

export function createTableFeed<T>(spec: TableFeedSpec<T>, deps: RuntimeDeps): TableFeed {
  const o: TableFeedSpec<T> & RuntimeDeps = { ...spec, ...deps };
  const groupId = `${o.groupPrefix}-table-${randomUUID()}`;
  let caught = false;
  let runner: Runner | null = null;
  /** The wait in flight, and how many asks it answers: those made before it read the topic's end. */
  let progress: { answers: number; done: Promise<boolean> } | null = null;
  let asks = 0;
  let stopped = false;

  const handler = async (records: { offset: string; key: string | null; value: T }[]) => {
    const rejected: Rejection[] = [];
    for (const r of records) {
      try {
        o.apply(r.value, r.key);
      } catch (err) {
        if (!(err instanceof TableRejection)) throw err;
        rejected.push({ offset: r.offset, reason: 'rejected', detail: err.message });
      }
    }
    o.onApplied?.('applied', records.length - rejected.length);
    o.onApplied?.('rejected', rejected.length);
    return { rejected };
  };

  /** Everything on the topic now, applied: true; false when stopped first, or the broker could not tell. */
  const readToEnd = (): Promise<boolean> =>
    (async (): Promise<boolean> => {
      const admin = o.kafka.admin();
      await admin.connect();
      try {
        const ends = await withRetry(
          () =>
            admin.fetchTopicOffsets(o.topic).catch((err: unknown) => {
              // A partition between leaders answers "not the leader" for a moment: worth the next attempt.
              throw new PaverError('KAFKA_UNAVAILABLE', errorMessage(err), { cause: err });
            }),
          {
            attempts: 8,
            initialMs: 250,
            maxMs: 4000,
          },
        );
        const target = new Map(
          ends.filter((p) => p.high !== p.low).map((p) => [p.partition, BigInt(p.high)]),
        );
        while (!stopped) {
          // The runner commits after each applied chunk, so the group's offsets say how far the table is.
          // Right after start-up the coordinator may not be there yet: keep polling.
          const committed = await admin.fetchOffsets({ groupId, topics: [o.topic] }).then(
            (r) => r[0],
            () => undefined,
          );
          const done =
            committed !== undefined &&
            [...target].every(
              ([p, high]) =>
                BigInt(committed.partitions.find((c) => c.partition === p)?.offset ?? '-1') >= high,
            );
          if (done) return (caught = true);
          await new Promise((r) => setTimeout(r, 100));
        }
        return false;
      } finally {
        await admin.disconnect().catch(() => undefined);
      }
    })().catch((err: unknown) => {
      // The broker unreachable past the retries: checked again on the next ask (`isCaughtUp` asks), so a
      // service whose consumption waits on the table does not wait for good.
      o.log.warn(
        { topic: o.topic, err: errorMessage(err) },
        'could not tell whether the table is read; trying again',
      );
      return false;
    });

  return {
    async start() {
      runner = createRunner<T>(
        {
          service: o.service,
          groupId,
          topics: [o.topic],
          fromBeginning: true,
          parse: o.parse,
          handler,
          ...(o.tombstone ? { tombstone: o.tombstone } : {}),
          // A registry outage pauses the table as it pauses the service's inputs: a framed record read meanwhile
          // spent the feed's retries and restarts, and its failure ended the process.
          ...(deps.codecWatch
            ? { ready: deps.codecWatch.ready, transientFailure: deps.codecWatch.transientFailure }
            : {}),
        },
        deps,
      );
      await runner.start();
    },
    caughtUp(timeoutMs) {
      const asked = ++asks;
      // One wait at a time (`isCaughtUp` asks on every probe); an ask made after it read the topic's end waits for
      // the next one.
      const answer = async (): Promise<boolean> => {
        for (;;) {
          progress ??= { answers: asks, done: readToEnd() };
          const p = progress;
          const read = await p.done;
          if (progress === p) progress = null;
          if (!read || p.answers >= asked || stopped) return read;
        }
      };
      return Promise.race([
        answer(),
        new Promise<boolean>((r) => setTimeout(() => r(false), timeoutMs).unref()),
      ]);
    },
    isCaughtUp() {
      if (!caught && !progress && !stopped && runner) void this.caughtUp(0);
      return caught;
    },
    async stop() {
      stopped = true;
      await progress?.done;
      await runner?.stop();
      // The throwaway group has served its purpose; leave no clutter behind on the broker.
      const admin = o.kafka.admin();
      await admin.connect().catch(() => undefined);
      await admin.deleteGroups([groupId]).catch(() => undefined);
      await admin.disconnect().catch(() => undefined);
    },
  };
}
