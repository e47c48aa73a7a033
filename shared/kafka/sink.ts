import { CompressionTypes, type Kafka, type Message, type Producer, type IHeaders } from 'kafkajs';
import { CONTRACTS } from '../../schemas/index.js';
import type { Codec } from '../codec.js';
import { PaverError, writeRefused } from '../errors.js';
import type { RuntimeMetrics } from '../metrics.js';
import { accepts, zodIssues } from '../validate.js';
import { isTooLarge, messageBytes } from './dead-letter.js';
import { keyedPartitioner } from './partitioner.js';
import { batchShare, PRODUCE_REQUEST_BUDGET, produceRequests, RECORD_BATCH_OVERHEAD } from './requests.js';

export { PRODUCE_REQUEST_BUDGET, PRODUCE_REQUEST_MAX_RECORDS, produceRequests } from './requests.js';

export interface OutRecord {
  key: string | null;
  value: unknown;
  headers?: IHeaders;
}

/**
 * Makes an output record that is over the size limit smaller, as its contract allows (e.g. leaving out a copy of
 * a payload the reader already has), or gives null when it cannot.
 */
export type Fit = (value: unknown) => unknown;

export interface SinkOptions {
  /**
   * PAVER_MAX_OUTPUT_BYTES: a record above this, counted as the broker counts it against max.message.bytes (batch
   * framing, key, value, headers: `messageBytes`), is made to fit, or left out.
   */
  maxRecordBytes?: number;
  /** Told of each record left out (never its content): the service logs it. */
  onDropped?: (topic: string, bytes: number) => void;
}

/** The producing side of the Kafka port: validates every record against its contract before it leaves. */
export interface Sink {
  connect(): Promise<void>;
  /**
   * A record over `maxRecordBytes` is passed to `fit` and sent as it returns, if that fits; otherwise it is
   * left out, counted and reported: one oversized output must not stop a service (the broker would refuse it,
   * every time the batch is read again). `'keep'`: records that must not be left out (a table's, whose copy
   * in Redis says they were published): one over the limit fails the send, as the broker would.
   */
  send(topic: string, contract: string, records: OutRecord[], fit?: Fit | 'keep'): Promise<void>;
  /**
   * Bytes as they are (dead letters keep the original message, state copies the stored value); a null value is
   * a tombstone. Split into requests under the byte budget, in order.
   */
  sendRaw(
    topic: string,
    records: { key: Buffer | string | null; value: Buffer | string | null; headers?: IHeaders }[],
  ): Promise<void>;
  disconnect(): Promise<void>;
  isConnected(): boolean;
}

export function createSink(
  kafka: Kafka,
  codec: Codec,
  metrics?: RuntimeMetrics,
  opts: SinkOptions = {},
): Sink {
  const maxRecordBytes = opts.maxRecordBytes ?? Infinity;
  // A request's records for one partition go as one record batch, which the topic's limit bounds too: shares
  // (`batchShare`) under this budget make batches the broker takes, at a topic limit of maxRecordBytes.
  const requestBudget = Math.min(PRODUCE_REQUEST_BUDGET, maxRecordBytes - RECORD_BATCH_OVERHEAD);
  const requests = <M>(messages: M[], bytes: number[]) =>
    produceRequests(messages, bytes.map(batchShare), requestBudget);
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
    async send(topic, contract, records, fit) {
      if (records.length === 0) return;
      const c = CONTRACTS[contract];
      if (!c) throw new PaverError('INTERNAL', `unknown contract ${contract}`);
      // Every record is checked, by the contract's compiled validator (zod where the contract cannot be
      // compiled faithfully): cheap enough for the hot path, so no sampling and no test-only checks.
      const valid = accepts(c.schema);
      const check = (value: unknown) => {
        if (valid(value)) return;
        // zod has the last word on a refusal (and names the field).
        const ok = c.schema.safeParse(value);
        if (ok.success) return;
        // An output that breaks its own contract is a bug in Paver, not bad input: fail loudly.
        throw new PaverError('INTERNAL', `output violates ${contract}: ${zodIssues(ok.error)}`);
      };
      for (const r of records) check(r.value);
      const encodeText = codec.encodeText;
      const encodeSync = codec.encodeSync;
      // A registry codec's encodes may wait on a registration: those run together, as one await.
      const encoded =
        encodeText || encodeSync
          ? null
          : await Promise.all(records.map((r) => codec.encode(contract, topic, r.value)));
      let messages: Message[] = new Array(records.length);
      let bytes = new Array<number>(records.length);
      let oversize = false;
      for (let i = 0; i < records.length; i++) {
        const r = records[i]!;
        const value = encodeText ? encodeText(r.value) : encoded ? encoded[i]! : encodeSync!(r.value);
        // No headers object unless the record has headers: kafkajs makes the empty one itself.
        const m: Message = { key: r.key, value };
        if (r.headers) m.headers = r.headers;
        messages[i] = m;
        // As the broker counts it: key and value alone let a record within about 80 bytes of the limit through,
        // and the broker refused it.
        bytes[i] = messageBytes(m);
        if (bytes[i]! > maxRecordBytes) oversize = true;
      }
      if (oversize && fit === 'keep')
        throw new PaverError(
          'INTERNAL',
          `an output record for ${topic} is over PAVER_MAX_OUTPUT_BYTES and must not be left out`,
        );
      if (oversize) {
        const keptMessages: Message[] = [];
        const keptBytes: number[] = [];
        for (let i = 0; i < messages.length; i++) {
          const m = messages[i]!;
          let n = bytes[i]!;
          if (n > maxRecordBytes) {
            const smaller = typeof fit === 'function' ? fit(records[i]!.value) : null;
            if (smaller !== null && smaller !== undefined) {
              check(smaller);
              // Rare: the general (asynchronous) encode, which every codec has.
              m.value = await codec.encode(contract, topic, smaller);
              n = messageBytes(m);
            }
            if (n > maxRecordBytes) {
              metrics?.oversizeOutputs.inc({ topic, outcome: 'dropped' });
              opts.onDropped?.(topic, n);
              continue;
            }
            metrics?.oversizeOutputs.inc({ topic, outcome: 'trimmed' });
          }
          keptMessages.push(m);
          keptBytes.push(n);
        }
        [messages, bytes] = [keptMessages, keptBytes];
      }
      try {
        for (const request of requests(messages, bytes))
          await producer.send({ topic, messages: request, acks: -1, compression: CompressionTypes.None });
      } catch (err) {
        // Under PAVER_MAX_OUTPUT_BYTES and still refused: the topic's limit is lower. A configuration error
        // (retrying cannot help), named as one.
        if (isTooLarge(err))
          throw new PaverError(
            'CONFIG_INVALID',
            `${topic} refused an output record as too large: set PAVER_MAX_OUTPUT_BYTES under the topic's max.message.bytes`,
          );
        // Refused for good (a permission, the topic's configuration): named as such, and not retried.
        throw writeRefused(topic, err) ?? err;
      }
      metrics?.published.inc({ topic }, messages.length);
    },
    async sendRaw(topic, records) {
      if (records.length === 0) return;
      const messages = records.map((r) => ({ ...r, headers: r.headers ?? {} }));
      // Split as `send` splits: a partition's records of one request form one record batch, which the topic's
      // limit bounds (a state copy of a whole batch can be megabytes).
      try {
        for (const request of requests(messages, messages.map(messageBytes)))
          await producer.send({ topic, messages: request, acks: -1 });
      } catch (err) {
        // Too large goes back as the broker said it (the runner's dead letters fall back to smaller records).
        throw (!isTooLarge(err) && writeRefused(topic, err)) || err;
      }
      metrics?.published.inc({ topic }, records.length);
    },
    disconnect: () => producer.disconnect(),
  };
}
