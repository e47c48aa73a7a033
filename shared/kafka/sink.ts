import { CompressionTypes, type Kafka, type Message, type Producer, type IHeaders } from 'kafkajs';
import { CONTRACTS } from '../../schemas/index.js';
import type { Codec } from '../codec.js';
import { PaverError } from '../errors.js';
import type { RuntimeMetrics } from '../metrics.js';
import { accepts, zodIssues } from '../validate.js';
import { keyedPartitioner } from './partitioner.js';

/**
 * Bytes of keys and values per produce request. A consumer batch's outputs go out together, and the broker
 * refuses a partition's record batch above its message.max.bytes (1 MiB by default): half of that leaves
 * room for headers and framing. Requests go one after another, so one key's records stay in order.
 */
export const PRODUCE_REQUEST_BUDGET = 512 * 1024;

/**
 * Records per produce request. kafkajs groups a request's records by partition by copying the partition's
 * array once per record, so its cost grows with the square of the records per partition; past a few hundred
 * per partition that copying and its garbage cost more than another request does. Measured with 3
 * partitions: see the README's performance section.
 */
export const PRODUCE_REQUEST_MAX_RECORDS = 1000;

/**
 * Consecutive slices of `messages` under both limits (a record bigger than the byte budget goes alone). The
 * requests are sent one after another, so one key's records keep their order.
 */
export function produceRequests<M>(
  messages: M[],
  bytes: number[],
  budget = PRODUCE_REQUEST_BUDGET,
  maxRecords = PRODUCE_REQUEST_MAX_RECORDS,
): M[][] {
  const requests: M[][] = [];
  let start = 0;
  let size = 0;
  for (let i = 0; i < messages.length; i++) {
    const n = bytes[i]!;
    if (i > start && (size + n > budget || i - start >= maxRecords)) {
      requests.push(messages.slice(start, i));
      start = i;
      size = 0;
    }
    size += n;
  }
  if (start < messages.length) requests.push(start === 0 ? messages : messages.slice(start));
  return requests;
}

export interface OutRecord {
  key: string | null;
  value: unknown;
  headers?: IHeaders;
}

/** The producing side of the Kafka port: validates every record against its contract before it leaves. */
export interface Sink {
  connect(): Promise<void>;
  send(topic: string, contract: string, records: OutRecord[]): Promise<void>;
  /** Bytes as they are (dead letters keep the original message); a null value is a tombstone. */
  sendRaw(
    topic: string,
    records: { key: Buffer | string | null; value: Buffer | string | null; headers?: IHeaders }[],
  ): Promise<void>;
  disconnect(): Promise<void>;
  isConnected(): boolean;
}

export function createSink(kafka: Kafka, codec: Codec, metrics?: RuntimeMetrics): Sink {
  const producer: Producer = kafka.producer({
    // kafkajs's default partitioning (murmur2 of the key, as the Java client), computed without its per-message
    // BigInt hash and metadata filter: the same key lands on the same partition as before.
    createPartitioner: keyedPartitioner(),
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
      const encodeText = codec.encodeText;
      const encodeSync = codec.encodeSync;
      // A registry codec's encodes may wait on a registration: those run together, as one await.
      const encoded =
        encodeText || encodeSync
          ? null
          : await Promise.all(records.map((r) => codec.encode(contract, topic, r.value)));
      const messages: Message[] = new Array(records.length);
      const bytes = new Array<number>(records.length);
      for (let i = 0; i < records.length; i++) {
        const r = records[i]!;
        const value = encodeText ? encodeText(r.value) : encoded ? encoded[i]! : encodeSync!(r.value);
        // No headers object unless the record has headers: kafkajs makes the empty one itself.
        const m: Message = { key: r.key, value };
        if (r.headers) m.headers = r.headers;
        messages[i] = m;
        bytes[i] = Buffer.byteLength(value) + (r.key === null ? 0 : Buffer.byteLength(r.key));
      }
      for (const request of produceRequests(messages, bytes))
        await producer.send({ topic, messages: request, acks: -1, compression: CompressionTypes.None });
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
