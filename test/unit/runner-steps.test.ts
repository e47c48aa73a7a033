import { describe, expect, it } from 'vitest';
import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1 } from '../../schemas/index.js';
import { jsonCodec, registryCodec } from '../../shared/codec.js';
import { processChunk, type BadRecord, type RawMessage } from '../../shared/kafka/chunk.js';
import { decodeMessage, decodeMessageSync, zodParser } from '../../shared/kafka/decode.js';
import { keyedPartitioner, murmur2 } from '../../shared/kafka/partitioner.js';
import { PRODUCE_REQUEST_MAX_RECORDS, produceRequests } from '../../shared/kafka/sink.js';
import { Partitioners, type PartitionMetadata } from 'kafkajs';
import fc from 'fast-check';
import { toolCall } from '../helpers/tool-call.js';

const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
const opts = { codec: jsonCodec(), parse, maxBytes: 2048 };
const buf = (v: unknown) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v));

describe('decode step', () => {
  it('gives a typed value or a dead-letter reason, never an exception for bad bytes', async () => {
    const cases: [Buffer | null, string][] = [
      [buf(toolCall(1)), 'ok'],
      [null, 'undecodable'],
      [Buffer.alloc(0), 'undecodable'],
      [buf('{"type": nope'), 'undecodable'],
      [buf({ ...toolCall(2), step: 'three' }), 'invalid'],
      [buf({ ...toolCall(3), type: 'tool_exploded' }), 'unknown_event_type'],
      [buf({ ...toolCall(4), args: { blob: 'x'.repeat(3000) } }), 'oversize'],
      [Buffer.from([0, 0, 0, 0, 7, 123, 125]), 'registry_error'],
    ];
    for (const [value, want] of cases) {
      const r = await decodeMessage({ key: null, value }, 't', opts);
      expect(r.ok ? 'ok' : r.reason).toBe(want);
      // The synchronous hot path gives the same answer for every message a JSON codec sees.
      const s = decodeMessageSync({ key: null, value }, 't', opts);
      expect(s && (s.ok ? 'ok' : s.reason)).toBe(want);
    }
  });

  it('leaves only Confluent-framed messages to the asynchronous path when a registry is configured', () => {
    // The registry is never contacted: deciding that a message needs it is local.
    const reg = { ...opts, codec: registryCodec({ url: 'http://127.0.0.1:9' }) };
    expect(decodeMessageSync({ key: null, value: Buffer.from([0, 0, 0, 0, 7, 123, 125]) }, 't', reg)).toBe(
      undefined,
    );
    const plain = decodeMessageSync({ key: null, value: buf(toolCall(1)) }, 't', reg);
    expect(plain?.ok).toBe(true);
    // A codec without a synchronous form (a service's own input codec) always takes the asynchronous path.
    const { decodeSync: _omitted, ...asyncOnly } = jsonCodec();
    expect(
      decodeMessageSync({ key: null, value: buf(toolCall(1)) }, 't', { ...opts, codec: asyncOnly }),
    ).toBe(undefined);
  });

  it('names the offending field when a record is invalid', async () => {
    const r = await decodeMessage({ key: null, value: buf({ ...toolCall(2), step: 'three' }) }, 't', opts);
    expect(r.ok ? '' : r.detail).toMatch(/^step: /);
  });

  it('maps a tombstone through the tombstone function when given', async () => {
    const r = await decodeMessage({ key: Buffer.from('k1'), value: null }, 't', {
      ...opts,
      tombstone: (key) => ({ ...toolCall(9), event_id: `deleted-${key}` }) as never,
    });
    expect(r.ok && (r.value as { event_id: string }).event_id).toBe('deleted-k1');
  });
});

const msg = (offset: number, value: unknown): RawMessage => ({
  offset: String(offset),
  key: Buffer.from('s'),
  value: buf(value),
  timestamp: '1700000000000',
});
const ctx = { heartbeat: async () => undefined, isRunning: () => true };
const direct = <R>(fn: () => Promise<R>) => fn();

describe('chunk step (the consumer loop body)', () => {
  it('hands good records to the handler, then dead-letters bad ones and rejections, in that order', async () => {
    const log: string[] = [];
    const chunk = [msg(10, toolCall(1)), msg(11, 'nope{'), msg(12, toolCall(2)), msg(13, toolCall(3))];
    const r = await processChunk({
      topic: 't',
      partition: 1,
      chunk,
      decode: (m) => decodeMessageSync(m, 't', opts),
      decodeAsync: (m) => decodeMessage(m, 't', opts),
      handler: async (records) => {
        log.push(`handler ${records.map((x) => x.offset).join(',')}`);
        return { rejected: [{ offset: '13', reason: 'rejected', detail: 'no' }] };
      },
      ctx,
      retry: direct,
      deadLetter: async (bad: BadRecord[]) => {
        log.push(`dead ${bad.map((b) => `${b.msg.offset}:${b.reason}`).join(',')}`);
      },
    });
    expect(log).toEqual(['handler 10,12,13', 'dead 11:undecodable,13:rejected']);
    expect(r).toEqual({ processed: 2, deadLettered: 2, last: '13' });
  });

  it('a failed dead-letter write fails the chunk (so it is not committed)', async () => {
    await expect(
      processChunk({
        topic: 't',
        partition: 0,
        chunk: [msg(0, 'bad')],
        decode: (m) => decodeMessageSync(m, 't', opts),
        decodeAsync: (m) => decodeMessage(m, 't', opts),
        handler: async () => undefined,
        ctx,
        retry: direct,
        deadLetter: async () => {
          throw new Error('broker gone');
        },
      }),
    ).rejects.toThrow('broker gone');
  });

  it('runs every effect through the retry policy', async () => {
    let calls = 0;
    let failures = 1;
    const retry = async <R>(fn: () => Promise<R>): Promise<R> => {
      for (;;) {
        try {
          return await fn();
        } catch (err) {
          if (failures-- <= 0) throw err;
        }
      }
    };
    const r = await processChunk({
      topic: 't',
      partition: 0,
      chunk: [msg(5, toolCall(5))],
      decode: (m) => decodeMessageSync(m, 't', opts),
      decodeAsync: (m) => decodeMessage(m, 't', opts),
      handler: async () => {
        if (calls++ === 0) throw new Error('transient');
      },
      ctx,
      retry,
      deadLetter: async () => undefined,
    });
    expect([calls, r.processed]).toEqual([2, 1]);
  });

  it('retries decoding only for messages that need I/O, and the handler once per chunk', async () => {
    const framed = (offset: number): RawMessage => ({
      ...msg(offset, ''),
      value: Buffer.from([0, 0, 0, 0, 1]),
    });
    const chunk = [msg(0, toolCall(0)), framed(1), msg(2, toolCall(2)), msg(3, toolCall(3))];
    const retried: string[] = [];
    let failNext = true;
    const r = await processChunk({
      topic: 't',
      partition: 0,
      chunk,
      decode: (m) => (m.value?.[0] === 0 ? undefined : decodeMessageSync(m, 't', opts)),
      decodeAsync: async (m) => {
        // A registry that fails once, then answers: the retry policy cures it.
        if (failNext) {
          failNext = false;
          throw new Error('registry down');
        }
        return { ok: true, value: { ...toolCall(Number(m.offset)), type: 'tool_call' } } as never;
      },
      handler: async (records) => {
        expect(records.map((x) => x.offset)).toEqual(['0', '1', '2', '3']);
      },
      ctx,
      retry: async <R>(fn: () => Promise<R>): Promise<R> => {
        retried.push('call');
        try {
          return await fn();
        } catch {
          retried.push('again');
          return fn();
        }
      },
      deadLetter: async () => undefined,
    });
    // One retried decode (the framed message, cured on its second try) and one retried handler call.
    expect(retried).toEqual(['call', 'again', 'call']);
    expect(r).toEqual({ processed: 4, deadLettered: 0, last: '3' });
  });
});

describe('produce step (the sink)', () => {
  const metadata = (n: number, leaderless: number[] = []): PartitionMetadata[] =>
    Array.from({ length: n }, (_, i) => ({
      partitionId: i,
      leader: leaderless.includes(i) ? -1 : 0,
      replicas: [0],
      isr: [0],
      partitionErrorCode: 0,
    }));
  // Keys of every shape: ASCII of every length mod 4, any Unicode (lone surrogates too), raw bytes.
  const keys = fc.oneof(
    fc.string({ maxLength: 40 }),
    fc.string({ unit: 'grapheme', maxLength: 12 }),
    fc.string({ unit: 'binary', maxLength: 12 }),
    fc.uint8Array({ maxLength: 24 }).map((b) => Buffer.from(b)),
    fc.uuid(),
  );

  it("puts every key on kafkajs's (and the Java client's) partition, for any partition count", () => {
    const ours = keyedPartitioner()();
    const theirs = Partitioners.DefaultPartitioner();
    fc.assert(
      fc.property(keys, fc.integer({ min: 1, max: 64 }), (key, n) => {
        const args = { topic: 't', partitionMetadata: metadata(n, [0]), message: { key, value: 'v' } };
        expect(ours(args)).toBe(theirs(args));
      }),
      { numRuns: 20_000 },
    );
    // Known values of the Java client's Utils.murmur2 (its test vectors), so both sides are checked at once.
    expect(murmur2('21')).toBe(-973932308);
    expect(murmur2('foobar')).toBe(-790332482);
    expect(murmur2('a-little-bit-long-string')).toBe(-985981536);
    expect(murmur2('a-little-bit-longer-string')).toBe(-1486304829);
    expect(murmur2('lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8')).toBe(-58897971);
    expect(murmur2(Buffer.from('abc'))).toBe(479470107);
  });

  it('reads the partition count at every call, so a topic that grew is partitioned as kafkajs would', () => {
    const ours = keyedPartitioner()();
    const theirs = Partitioners.DefaultPartitioner();
    for (const n of [3, 6, 3, 12]) {
      for (let i = 0; i < 500; i++) {
        const args = {
          topic: 't',
          partitionMetadata: metadata(n),
          message: { key: `sess-${i}`, value: 'v' },
        };
        expect(ours(args)).toBe(theirs(args));
      }
    }
  });

  it("leaves an explicit partition and a keyless record to kafkajs's rules", () => {
    const ours = keyedPartitioner()();
    const partitionMetadata = metadata(4, [1, 2]);
    expect(ours({ topic: 't', partitionMetadata, message: { key: 'k', partition: 2, value: 'v' } })).toBe(2);
    // Keyless: round-robin over the partitions that have a leader.
    const seen = new Set<number>();
    for (let i = 0; i < 8; i++)
      seen.add(ours({ topic: 't', partitionMetadata, message: { key: null, value: 'v' } }));
    expect([...seen].sort()).toEqual([0, 3]);
  });

  it('splits a batch into requests in order, under the byte budget and the record limit', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 400 }), { maxLength: 3000 }),
        fc.integer({ min: 1, max: 50 }),
        (bytes, maxRecords) => {
          const messages = bytes.map((_, i) => i);
          const requests = produceRequests(messages, bytes, 1000, maxRecords);
          expect(requests.flat()).toEqual(messages);
          for (const r of requests) {
            expect(r.length).toBeGreaterThan(0);
            expect(r.length).toBeLessThanOrEqual(maxRecords);
            const size = r.reduce((a, i) => a + bytes[i]!, 0);
            expect(r.length === 1 || size <= 1000).toBe(true);
          }
        },
      ),
      { numRuns: 300 },
    );
    // A record over the budget goes alone; a small batch goes whole, as it came.
    expect(produceRequests(['a', 'b', 'c'], [10, 2000, 10], 1000)).toEqual([['a'], ['b'], ['c']]);
    const small = ['a', 'b'];
    expect(produceRequests(small, [1, 1])[0]).toBe(small);
    const n = PRODUCE_REQUEST_MAX_RECORDS * 2 + 7;
    const sizes = produceRequests(Array<number>(n).fill(0), Array<number>(n).fill(1)).map((r) => r.length);
    expect(sizes).toEqual([PRODUCE_REQUEST_MAX_RECORDS, PRODUCE_REQUEST_MAX_RECORDS, 7]);
  });
});
