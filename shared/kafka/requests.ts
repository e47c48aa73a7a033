/**
 * How a burst of records is cut into produce requests: the services' sink and the client publisher share it.
 * No imports, so the client package does not load the services' runtime for it.
 */

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

/**
 * A v2 record batch's framing before its records (the log overhead included), which the broker's
 * message.max.bytes (a topic's max.message.bytes) counts along with them.
 */
export const RECORD_BATCH_OVERHEAD = 61;

/** Bytes of a zigzag varint, the way Kafka writes a record's lengths and deltas. */
function varintBytes(n: number): number {
  let z = n >= 0 ? n * 2 : -n * 2 - 1;
  let bytes = 1;
  while (z >= 128) {
    z = Math.floor(z / 128);
    bytes++;
  }
  return bytes;
}

/**
 * Size of the record batch one record goes out in alone, as the broker measures it against message.max.bytes:
 * batch framing, the record's length, attributes and deltas, its key, value and headers (`[keyBytes,
 * valueBytes]` each). A record checked on its value alone would be refused by the broker within about 80 bytes
 * of the limit. Alone is how a record near the limit goes: a produce request holds others only under its budget.
 */
export function recordBatchBytes(
  keyBytes: number | null,
  valueBytes: number,
  headers: readonly (readonly [number, number])[] = [],
): number {
  // Attributes, then timestamp and offset deltas (0 for a batch's first record): one byte each.
  let body = 3;
  body += keyBytes === null ? varintBytes(-1) : varintBytes(keyBytes) + keyBytes;
  body += varintBytes(valueBytes) + valueBytes;
  body += varintBytes(headers.length);
  for (const [k, v] of headers) body += varintBytes(k) + k + varintBytes(v) + v;
  return RECORD_BATCH_OVERHEAD + varintBytes(body) + body;
}

/**
 * What a record adds to a record batch it shares with others, from `recordBatchBytes` of it alone: the batch's
 * framing is counted once per batch, and an offset delta past the batch's 64th record takes a second byte (up to
 * PRODUCE_REQUEST_MAX_RECORDS), which can lengthen the record's length varint by one more. With these shares and
 * a budget of the limit less RECORD_BATCH_OVERHEAD, `produceRequests` cuts requests whose every partition's record
 * batch is within the limit, whatever the partitioner does with them.
 */
export function batchShare(aloneBytes: number): number {
  return aloneBytes - RECORD_BATCH_OVERHEAD + 2;
}
