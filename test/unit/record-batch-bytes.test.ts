import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { batchShare, RECORD_BATCH_OVERHEAD, recordBatchBytes } from '../../shared/kafka/requests.js';

// kafkajs's own encoders: the bytes it sends, which are what the broker measures.
const require = createRequire(import.meta.url);
type Encoded = { buffer: Buffer };
const Record = require('kafkajs/src/protocol/recordBatch/record/v0/index.js') as (r: {
  offsetDelta: number;
  key: Buffer | null;
  value: Buffer;
  headers: Record<string, Buffer>;
}) => unknown;
const { RecordBatch } = require('kafkajs/src/protocol/recordBatch/v0/index.js') as {
  RecordBatch: (b: { records: unknown[] }) => Promise<Encoded>;
};

/** A small deterministic generator: the test is the same on every run. */
function lcg(seed: number) {
  let s = seed;
  return (n: number) => {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    return s % n;
  };
}

describe('record batch sizes, as kafkajs encodes them', () => {
  it('a record alone is exactly recordBatchBytes; records together within the overhead plus their shares', async () => {
    const rnd = lcg(7);
    for (let round = 0; round < 40; round++) {
      const n = [1, 2, 63, 64, 65, 200, 1000][round % 7]!;
      const recs = Array.from({ length: n }, () => {
        const key = rnd(4) === 0 ? null : Buffer.alloc(rnd(100));
        const value = Buffer.alloc(rnd(round % 2 ? 300 : 20_000));
        const headers: Record<string, Buffer> = {};
        for (let h = rnd(3); h > 0; h--) headers[`h${h}`.padEnd(1 + rnd(20), 'x')] = Buffer.alloc(rnd(200));
        const alone = recordBatchBytes(
          key === null ? null : key.length,
          value.length,
          Object.entries(headers).map(([k, v]) => [Buffer.byteLength(k), v.length] as const),
        );
        return { key, value, headers, alone };
      });
      const encoded = await RecordBatch({
        records: recs.map((r, i) =>
          Record({ offsetDelta: i, key: r.key, value: r.value, headers: r.headers }),
        ),
      });
      if (n === 1) expect(encoded.buffer.length).toBe(recs[0]!.alone);
      const shares = recs.reduce((sum, r) => sum + batchShare(r.alone), 0);
      expect(encoded.buffer.length).toBeLessThanOrEqual(RECORD_BATCH_OVERHEAD + shares);
    }
  });
});
