import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { deadLetterRecordV1 } from '../../schemas/index.js';
import {
  buildDeadLetter,
  DETAIL_MAX,
  HASH_ONLY_DEAD_LETTER_MAX_BYTES,
  headerBytes,
  isTooLarge,
  MAX_ORIGINAL_HEADER_BYTES,
  MAX_SERVICE_NAME,
  messageBytes,
  withoutOriginal,
} from '../../shared/kafka/dead-letter.js';

const src = (value: Buffer | null, key: Buffer | null = Buffer.from('k')) => ({
  topic: 't',
  partition: 2,
  offset: '41',
  key,
  value,
  timestamp: '1700000000000',
});
const limits = { maxOriginalBytes: 1000, maxKeyBytes: 16 };

// kafkajs's own record codec (the one the runner reads with and the producer writes with), no broker needed.
const kafkajs = createRequire(import.meta.url);
interface Enc {
  buffer: Buffer;
  writeInt8(v: number): Enc;
  writeVarInt(v: number): Enc;
  writeVarLong(v: number): Enc;
  writeVarIntString(v: string): Enc;
  writeVarIntBytes(v: Buffer | null): Enc;
}
const Encoder = kafkajs('kafkajs/src/protocol/encoder.js') as new () => Enc;
const Decoder = kafkajs('kafkajs/src/protocol/decoder.js') as new (b: Buffer) => unknown;
const decodeRecord = kafkajs('kafkajs/src/protocol/recordBatch/record/v0/decoder.js') as (
  d: unknown,
  ctx: object,
) => { headers: Record<string, Buffer | null | (Buffer | null)[]> };
const encodeRecord = kafkajs('kafkajs/src/protocol/recordBatch/record/v0/index.js') as (r: {
  key: Buffer | null;
  value: string;
  headers: unknown;
}) => unknown;
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

describe('dead-letter record builder', () => {
  it('keeps the original bytes up to the limit, valid against its contract', () => {
    const value = Buffer.from('{"a":1}');
    const m = buildDeadLetter('svc', src(value), 'invalid', 'a: bad', limits, 5);
    const body = deadLetterRecordV1.parse(JSON.parse(m.value));
    expect(body.original_b64).toBe(value.toString('base64'));
    expect(body.original_sha256).toBe(sha(value));
    expect(body.source).toEqual({
      topic: 't',
      partition: 2,
      offset: '41',
      key_b64: 'aw==',
      timestamp: '1700000000000',
    });
    expect(m.headers['paver-dlq-reason']).toBe('invalid');
    expect(m.headers['paver-source-offset']).toBe('41');
    expect(m.key).toEqual(Buffer.from('k'));
  });

  it('beyond the limit keeps size, hash and position only: the record size does not grow with the message', () => {
    const value = Buffer.alloc(5_000_000, 120);
    const key = Buffer.alloc(100, 107);
    const m = buildDeadLetter('svc', src(value, key), 'oversize', 'x'.repeat(10_000), limits, 5);
    expect(Buffer.byteLength(m.value)).toBeLessThan(6 * 1024);
    const body = deadLetterRecordV1.parse(JSON.parse(m.value));
    expect(body.original_b64).toBeNull();
    expect(body.original_size).toBe(5_000_000);
    expect(body.original_sha256).toBe(sha(value));
    expect(body.source.key_b64).toBeNull();
    expect(body.source.key_sha256).toBe(sha(key));
    expect(body.detail).toHaveLength(4096);
    expect(m.key).toBeNull();
  });

  it('never cuts the detail inside a surrogate pair', () => {
    const detail = 'a'.repeat(4095) + '😀';
    const body = JSON.parse(buildDeadLetter('svc', src(null, null), 'invalid', detail, limits, 1).value) as {
      detail: string;
    };
    expect(body.detail).toBe('a'.repeat(4095));
  });

  it("carries the source's headers (repeated ones too) under Paver's own, none beyond MAX_ORIGINAL_HEADER_BYTES", () => {
    const headers = {
      traceparent: Buffer.from('00-abc-01'),
      tag: [Buffer.from('a'), Buffer.from('b')],
      'paver-dlq-reason': Buffer.from('forged'),
    };
    const m = buildDeadLetter('svc', { ...src(Buffer.from('x')), headers }, 'invalid', 'd', limits, 5);
    expect(m.headers.traceparent).toEqual(Buffer.from('00-abc-01'));
    expect(m.headers.tag).toEqual([Buffer.from('a'), Buffer.from('b')]);
    expect(m.headers['paver-dlq-reason']).toBe('invalid');
    expect(m.headers['paver-dlq-headers-dropped']).toBeUndefined();
    const big = { a: Buffer.alloc(MAX_ORIGINAL_HEADER_BYTES, 97), b: 'x' };
    const over = buildDeadLetter(
      'svc',
      { ...src(Buffer.from('x')), headers: big },
      'invalid',
      'd',
      limits,
      5,
    );
    expect(over.headers.a).toBeUndefined();
    expect(over.headers.b).toBeUndefined();
    expect(over.headers['paver-dlq-headers-dropped']).toBe('2');
    expect(headerBytes(over.headers)).toBeLessThan(1024);
    // The fallback for a broker that refuses the full record carries position and hash only.
    const small = withoutOriginal('svc', { ...src(Buffer.from('x')), headers }, 'invalid', 'd', 5);
    expect(small.headers.traceparent).toBeUndefined();
    expect(small.headers['paver-dlq-reason']).toBe('invalid');
  });

  it('takes a source header with a null value (as kafkajs reads one) and stays writable by kafkajs', () => {
    // A record as another client may write it (Java's `new RecordHeader(name, null)`): one header whose value is
    // null, one repeated with a null among its values. kafkajs reads those values as null.
    const body = new Encoder()
      .writeInt8(0)
      .writeVarLong(0)
      .writeVarInt(0)
      .writeVarIntBytes(Buffer.from('k'))
      .writeVarIntBytes(Buffer.from('{not json'))
      .writeVarInt(4)
      .writeVarIntString('traceparent')
      .writeVarIntBytes(Buffer.from('00-abc-01'))
      .writeVarIntString('x-null')
      .writeVarIntBytes(null)
      .writeVarIntString('x-rep')
      .writeVarIntBytes(Buffer.from('a'))
      .writeVarIntString('x-rep')
      .writeVarIntBytes(null).buffer;
    const { headers } = decodeRecord(new Decoder(body), { firstOffset: '41', firstTimestamp: '0' });
    expect(headers['x-null']).toBeNull();

    const m = buildDeadLetter(
      'svc',
      { ...src(Buffer.from('{not json')), headers: headers as never },
      'undecodable',
      'not valid JSON',
      limits,
      1,
    );
    // The dead letter is written by kafkajs, which cannot write a null header value.
    expect(() => encodeRecord(m)).not.toThrow();
    expect(m.headers.traceparent).toEqual(Buffer.from('00-abc-01'));
    expect(m.headers['x-rep']).toEqual([Buffer.from('a')]);
    expect(m.headers['x-null']).toBeUndefined();
    expect(m.headers['paver-dlq-headers-dropped']).toBe('2');
    expect(headerBytes(m.headers)).toBeLessThan(1024);
  });

  it('withoutOriginal drops the bytes but keeps the hash; empty values have no hash', () => {
    const value = Buffer.from('abc');
    const body = deadLetterRecordV1.parse(
      JSON.parse(withoutOriginal('svc', src(value), 'invalid', 'd', 1).value),
    );
    expect([body.original_b64, body.original_size, body.original_sha256]).toEqual([null, 3, sha(value)]);
    const empty = deadLetterRecordV1.parse(
      JSON.parse(buildDeadLetter('svc', src(null), 'undecodable', 'empty', limits, 1).value),
    );
    expect([empty.original_b64, empty.original_size, empty.original_sha256]).toEqual([null, 0, undefined]);
  });

  it('recognises the broker refusing a record as too large, also when wrapped', () => {
    expect(isTooLarge({ type: 'MESSAGE_TOO_LARGE' })).toBe(true);
    expect(isTooLarge(new Error('outer', { cause: { type: 'RECORD_LIST_TOO_LARGE' } }))).toBe(true);
    expect(
      isTooLarge(
        new Error('The request included a message larger than the max message size the server will accept'),
      ),
    ).toBe(true);
    expect(isTooLarge(new Error('Connection error: ECONNREFUSED'))).toBe(false);
  });
});

describe('HASH_ONLY_DEAD_LETTER_MAX_BYTES (the least PAVER_MAX_OUTPUT_BYTES)', () => {
  it('holds every hash-only dead letter, whatever its detail is written as, and is no looser than the worst one', () => {
    const worstSource = {
      topic: 'T'.repeat(249),
      partition: 2 ** 31 - 1,
      offset: '9223372036854775807',
      key: Buffer.from('key'),
      value: Buffer.from('value'),
      timestamp: '-9223372036854775808',
    };
    // Every way a code unit is written in JSON: plain, escaped in two bytes or six, three UTF-8 bytes, a pair.
    const details = ['a', '"', '\n', '\u0000', '\u00e9', '\u20ac', '\ud800', '\udc00', '\ud83d\ude00'].map(
      (c) => c.repeat(Math.ceil(DETAIL_MAX / c.length)),
    );
    const sizes = details.map((d) =>
      messageBytes(
        withoutOriginal('S'.repeat(MAX_SERVICE_NAME), worstSource, 'unknown_event_type', d, Date.now()),
      ),
    );
    for (const n of sizes) expect(n).toBeLessThanOrEqual(HASH_ONLY_DEAD_LETTER_MAX_BYTES);
    // The control characters' one, the worst: within the digits its size and time could still grow by.
    expect(Math.max(...sizes)).toBeGreaterThan(HASH_ONLY_DEAD_LETTER_MAX_BYTES - 32);
  });
});
