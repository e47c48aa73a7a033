import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DecodeError, jsonCodec, registryCodec } from '../../shared/codec.js';
import { PaverError } from '../../shared/errors.js';
import { startRegistryDouble } from '../helpers/registry-double.js';

const record = {
  schema_version: 1,
  service: 'detector',
  reason: 'invalid',
  detail: 'x',
  source: { topic: 't', partition: 0, offset: '5', key_b64: null, timestamp: '1' },
  original_size: 0,
  original_b64: null,
  dead_lettered_at: 1,
};
let reg: Awaited<ReturnType<typeof startRegistryDouble>>;
beforeAll(async () => (reg = await startRegistryDouble()));
afterAll(() => reg.close());

describe('codec: JSON by default, Confluent wire format with a registry (registry double, real client)', () => {
  it('registers the contract as a JSON Schema subject and frames messages with magic byte 0 and the schema id', async () => {
    const codec = registryCodec({ url: reg.url });
    const buf = await codec.encode('dead-letters.v1', 'paver.dead-letters.v1', record);
    expect(buf[0]).toBe(0);
    expect(buf.readInt32BE(1)).toBe(1);
    expect(JSON.parse(buf.subarray(5).toString())).toEqual(record);
    expect(reg.schemas.get(1)?.schemaType).toBe('JSON');
    expect(await codec.decode(buf)).toEqual(record);
    // The same codec also reads plain JSON: decoding detects the framing per message.
    expect(await codec.decode(Buffer.from(JSON.stringify({ a: 1 })))).toEqual({ a: 1 });
  });

  it('dead-letters what cannot be decoded, and retries what the registry could not answer', async () => {
    const codec = registryCodec({ url: reg.url });
    await expect(codec.decode(Buffer.from([0, 0, 0, 0, 99, 123, 125]))).rejects.toMatchObject({
      reason: 'registry_error',
    });
    await expect(jsonCodec().decode(Buffer.from([0, 0, 0, 0, 1, 123, 125]))).rejects.toBeInstanceOf(
      DecodeError,
    );
    await expect(jsonCodec().decode(Buffer.from('{oops'))).rejects.toMatchObject({ reason: 'undecodable' });
    const down = registryCodec({ url: 'http://127.0.0.1:1' });
    const err = await down.decode(Buffer.from([0, 0, 0, 0, 1, 123, 125])).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PaverError);
    expect((err as PaverError).retriable).toBe(true);
  });
});
