import { randomUUID } from 'node:crypto';
import type { Kafka } from 'kafkajs';
import { toolCatalogRecordV1, type ToolCatalogRecord } from '../../../../schemas/index.js';
import type { Codec } from '../../../../shared/codec.js';
import type { CommonEnv } from '../../../../shared/config.js';
import { createRunner, zodParser, type Parser, type Rejection, type Runner } from '../../../../shared/kafka/runner.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { Logger } from '../../../../shared/log.js';
import type { RuntimeMetrics } from '../../../../shared/metrics.js';
import { CatalogError, type Catalog } from '../core/catalog.js';

type Tombstone = { kind: 'tombstone'; key: string | null };
type FeedRecord = ToolCatalogRecord | Tombstone;

/** `tenant/agent/tool/NAME` → the tool it names (parts URI-encoded); anything else is not a tool key. */
export function parseToolKey(key: string | null): { tenant_id: string; agent_id: string; name: string } | null {
  const parts = key?.split('/');
  if (parts?.length !== 4 || parts[2] !== 'tool') return null;
  try {
    const [tenant_id, agent_id, , name] = parts.map(decodeURIComponent) as [string, string, string, string];
    return { tenant_id, agent_id, name };
  } catch {
    return null;
  }
}

export interface CatalogFeed {
  start(): Promise<void>;
  /** Resolves true once everything on the topic at start-up has been applied (false after `timeoutMs`). */
  caughtUp(timeoutMs: number): Promise<boolean>;
  isCaughtUp(): boolean;
  stop(): Promise<void>;
}

/**
 * Every instance reads the whole compacted catalog topic (its own throwaway consumer group, from the
 * beginning), so each holds the full catalog. Records that fail validation or whose schema does not compile
 * go to the dead-letter topic, and the catalog in force stays as it was.
 */
export function createCatalogFeed(o: {
  topic: string;
  groupPrefix: string;
  catalog: Catalog;
  env: CommonEnv;
  kafka: Kafka;
  codec: Codec;
  sink: Sink;
  metrics: RuntimeMetrics;
  log: Logger;
  onFatal: (err: Error) => void;
  onApplied: (outcome: 'applied' | 'rejected', n: number) => void;
}): CatalogFeed {
  const groupId = `${o.groupPrefix}-catalog-${randomUUID()}`;
  const base = zodParser(toolCatalogRecordV1);
  const parse: Parser<FeedRecord> = (v, t) => base(v, t);
  let caught = false;
  let runner: Runner | null = null;
  let progress: Promise<boolean> | null = null;
  let stopped = false;

  const handler = async (records: { offset: string; key: string | null; value: FeedRecord }[]) => {
    const rejected: Rejection[] = [];
    for (const r of records) {
      const v = r.value;
      try {
        if (v.kind === 'tombstone') {
          const ref = parseToolKey(v.key);
          if (!ref) throw new CatalogError(`tombstone key must be tenant/agent/tool/NAME`);
          o.catalog.apply({ schema_version: 1, kind: 'tool_removed', ...ref });
        } else o.catalog.apply(v);
      } catch (err) {
        if (!(err instanceof CatalogError)) throw err;
        rejected.push({ offset: r.offset, reason: 'rejected', detail: err.message });
      }
    }
    o.onApplied('applied', records.length - rejected.length);
    o.onApplied('rejected', rejected.length);
    return { rejected };
  };

  return {
    async start() {
      runner = createRunner<FeedRecord>({
        service: 'autoseq',
        groupId,
        topics: [o.topic],
        fromBeginning: true,
        parse,
        handler,
        tombstone: (key) => ({ kind: 'tombstone', key }),
        env: o.env,
        kafka: o.kafka,
        codec: o.codec,
        sink: o.sink,
        metrics: o.metrics,
        log: o.log,
        onFatal: o.onFatal,
      });
      await runner.start();
    },
    caughtUp(timeoutMs) {
      progress ??= (async () => {
        const admin = o.kafka.admin();
        await admin.connect();
        try {
          const ends = await admin.fetchTopicOffsets(o.topic);
          const target = new Map(ends.filter((p) => p.high !== p.low).map((p) => [p.partition, BigInt(p.high)]));
          while (!stopped) {
            // The runner commits after each applied chunk, so the group's offsets say how far the catalog is.
            const [committed] = await admin.fetchOffsets({ groupId, topics: [o.topic] });
            const done = [...target].every(([p, high]) => BigInt(committed?.partitions.find((c) => c.partition === p)?.offset ?? '-1') >= high);
            if (done) return (caught = true);
            await new Promise((r) => setTimeout(r, 100));
          }
          return false;
        } finally {
          await admin.disconnect();
        }
      })();
      // Past the timeout the service starts anyway (readiness stays false) and the poll goes on.
      return Promise.race([progress, new Promise<boolean>((r) => setTimeout(() => r(false), timeoutMs).unref())]);
    },
    isCaughtUp: () => caught,
    stop: async () => {
      stopped = true;
      await progress?.catch(() => undefined);
      await runner?.stop();
      // The throwaway group has served its purpose; leave no clutter behind on the broker.
      const admin = o.kafka.admin();
      await admin.connect().catch(() => undefined);
      await admin.deleteGroups([groupId]).catch(() => undefined);
      await admin.disconnect().catch(() => undefined);
    },
  };
}
