import { CompressionTypes, Partitioners, type Kafka, type Producer, type IHeaders } from 'kafkajs';
import { CONTRACTS } from '../../schemas/index.js';
import type { Codec } from '../codec.js';
import { PaverError } from '../errors.js';
import type { RuntimeMetrics } from '../metrics.js';
import { accepts, zodIssues } from '../validate.js';
import { groupBySize } from './dead-letter.js';

/**
 * Bytes of keys and values per produce request. A consumer batch's outputs go out together, and the broker
 * refuses a partition's record batch above its message.max.bytes (1 MiB by default): half of that leaves
 * room for headers and framing. Requests go one after another, so one key's records stay in order.
 */
export const PRODUCE_REQUEST_BUDGET = 512 * 1024;

export interface OutRecord {
  key: string | null;
  value: unknown;
  headers?: IHeaders;
}

/** The producing side of the Kafka port: validates every record against its contract before it leaves. */
export interface Sink {
  connect(): Promise<void>;
  send(topic: string, contract: string, records: OutRecord[]): Promise<void>;
  /** Bytes as they are (dead letters keep the original message). */
  sendRaw(
    topic: string,
    records: { key: Buffer | string | null; value: Buffer | string; headers?: IHeaders }[],
  ): Promise<void>;
  disconnect(): Promise<void>;
  isConnected(): boolean;
}

export function createSink(kafka: Kafka, codec: Codec, metrics?: RuntimeMetrics): Sink {
  const producer: Producer = kafka.producer({
    createPartitioner: Partitioners.DefaultPartitioner,
    allowAutoTopicCreation: false,
    retry: { retries: 5, initialRetryTime: 200 },
  });
  let connected = false;
  producer.on(producer.events.CONNECT, () => (connected = true));
  producer.on(producer.events.DISCONNECT, () => (connected = false));

  return {
    connect: () => producer.connect(),
    isConnected: () => connected,
    async send(topic, contract, records) {
      if (records.length === 0) return;
      const c = CONTRACTS[contract];
      if (!c) throw new PaverError('INTERNAL', `unknown contract ${contract}`);
      // Every record is checked, by the contract's compiled validator (zod where the contract cannot be
      // compiled faithfully): cheap enough for the hot path, so no sampling and no test-only checks.
      const valid = accepts(c.schema);
      for (const r of records) {
        if (valid(r.value)) continue;
        // zod has the last word on a refusal (and names the field).
        const ok = c.schema.safeParse(r.value);
        if (ok.success) continue;
        // An output that breaks its own contract is a bug in Paver, not bad input: fail loudly.
        throw new PaverError('INTERNAL', `output violates ${contract}: ${zodIssues(ok.error)}`);
      }
      const encodeSync = codec.encodeSync;
      const messages = encodeSync
        ? records.map((r) => ({ key: r.key, value: encodeSync(r.value), headers: r.headers ?? {} }))
        : await Promise.all(
            records.map(async (r) => ({
              key: r.key,
              value: await codec.encode(contract, topic, r.value),
              headers: r.headers ?? {},
            })),
          );
      for (const group of groupBySize(
        messages,
        (m) => m.value.length + (m.key === null ? 0 : Buffer.byteLength(m.key)),
        PRODUCE_REQUEST_BUDGET,
      ))
        await producer.send({ topic, messages: group, acks: -1, compression: CompressionTypes.None });
      metrics?.published.inc({ topic }, records.length);
    },
    async sendRaw(topic, records) {
      if (records.length === 0) return;
      await producer.send({
        topic,
        messages: records.map((r) => ({ ...r, headers: r.headers ?? {} })),
        acks: -1,
      });
      metrics?.published.inc({ topic }, records.length);
    },
    disconnect: () => producer.disconnect(),
  };
}
