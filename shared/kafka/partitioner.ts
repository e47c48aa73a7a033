import { Partitioners, type ICustomPartitioner } from 'kafkajs';

const M = 0x5bd1e995;

/**
 * Kafka's murmur2 over a key's UTF-8 bytes (the Java client's `Utils.murmur2`, which kafkajs's
 * DefaultPartitioner reimplements with 64-bit BigInt arithmetic and a Buffer per call). Every step here is
 * 32-bit: only the low 32 bits of those products ever reach the result, so `Math.imul` gives the same value.
 * An ASCII string is hashed from its char codes, which are its UTF-8 bytes, with no Buffer.
 */
export function murmur2(key: string | Buffer): number {
  if (typeof key === 'string') {
    for (let i = 0; i < key.length; i++) if (key.charCodeAt(i) > 0x7f) return murmur2Bytes(Buffer.from(key));
    return murmur2Ascii(key);
  }
  return murmur2Bytes(key);
}

function murmur2Bytes(d: Buffer): number {
  const n = d.length;
  const n4 = n & ~3;
  let h = 0x9747b28c ^ n;
  for (let i = 0; i < n4; i += 4) {
    let k = d[i]! | (d[i + 1]! << 8) | (d[i + 2]! << 16) | (d[i + 3]! << 24);
    k = Math.imul(k, M);
    k ^= k >>> 24;
    h = Math.imul(h, M) ^ Math.imul(k, M);
  }
  const rest = n & 3;
  if (rest > 0) {
    if (rest === 3) h ^= d[n4 + 2]! << 16;
    if (rest >= 2) h ^= d[n4 + 1]! << 8;
    h = Math.imul(h ^ d[n4]!, M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  return h ^ (h >>> 15);
}

function murmur2Ascii(s: string): number {
  const n = s.length;
  const n4 = n & ~3;
  let h = 0x9747b28c ^ n;
  for (let i = 0; i < n4; i += 4) {
    let k =
      s.charCodeAt(i) |
      (s.charCodeAt(i + 1) << 8) |
      (s.charCodeAt(i + 2) << 16) |
      (s.charCodeAt(i + 3) << 24);
    k = Math.imul(k, M);
    k ^= k >>> 24;
    h = Math.imul(h, M) ^ Math.imul(k, M);
  }
  const rest = n & 3;
  if (rest > 0) {
    if (rest === 3) h ^= s.charCodeAt(n4 + 2) << 16;
    if (rest >= 2) h ^= s.charCodeAt(n4 + 1) << 8;
    h = Math.imul(h ^ s.charCodeAt(n4), M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  return h ^ (h >>> 15);
}

/** The non-negative form the Java client and kafkajs take the partition from (not the absolute value). */
export const toPositive = (x: number): number => x & 0x7fffffff;

/**
 * kafkajs's DefaultPartitioner, made cheap for keyed records: a keyed record goes to
 * `toPositive(murmur2(key)) % partition count`, exactly as with kafkajs (and the Java client), so keys stay on
 * the partitions they had; everything else (an explicit partition, no key) is left to kafkajs's own
 * partitioner. kafkajs calls a partitioner once per message with the topic's metadata as of that send (also
 * on a retry after a metadata refresh): the partition count is read from it at every call, so a topic that
 * grew is partitioned as kafkajs would, and only hashes are kept, never partitions. The per-call costs it
 * removes are kafkajs's BigInt murmur2 with a Buffer per key and a filter over the partition metadata.
 */
export function keyedPartitioner(): ICustomPartitioner {
  return () => {
    const fallback = Partitioners.DefaultPartitioner();
    return (args) => {
      const { message, partitionMetadata } = args;
      const key = message.key;
      if (message.partition !== null && message.partition !== undefined) return message.partition;
      if (typeof key === 'string' || Buffer.isBuffer(key))
        return toPositive(murmur2(key)) % partitionMetadata.length;
      return fallback(args);
    };
  };
}
