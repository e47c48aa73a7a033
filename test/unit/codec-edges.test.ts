import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1 } from '../../schemas/index.js';
import { jsonCodec, registryCodec } from '../../shared/codec.js';
import { PaverError } from '../../shared/errors.js';
import { decodeMessage, decodeMessageSync, zodParser } from '../../shared/kafka/decode.js';
import { startRegistryDouble } from '../helpers/registry-double.js';
import { toolCall } from '../helpers/tool-call.js';

const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
const event = toolCall(1);
const verdict = (r: { ok: boolean; reason?: string } | undefined) => r && (r.ok ? 'ok' : r.reason);
const frame = (id: number, payload: Buffer) => {
  const head = Buffer.alloc(5);
  head.writeInt32BE(id, 1);
  return Buffer.concat([head, payload]);
};

let registry: Awaited<ReturnType<typeof startRegistryDouble>>;
beforeAll(async () => {
  registry = await startRegistryDouble();
});
afterAll(() => registry.close());

describe('decode step: bytes that are not what they claim', () => {
  it('dead-letters JSON text that is not valid UTF-8 instead of reading replacement characters', async () => {
    // "search" with one byte 0xff in it: text in no encoding JSON allows. Read as UTF-8 with replacements it
    // would pass as the tool "sea\uFFFDrch", and two different bad names would become one.
    const bytes = Buffer.from(JSON.stringify({ ...event, tool: 'seaXrch' }));
    bytes[bytes.indexOf('seaXrch') + 3] = 0xff;
    for (const codec of [jsonCodec(), registryCodec({ url: registry.url })]) {
      const o = { codec, parse, maxBytes: 1 << 20 };
      expect(verdict(decodeMessageSync({ key: null, value: bytes }, 't', o))).toBe('undecodable');
      expect(verdict(await decodeMessage({ key: null, value: bytes }, 't', o))).toBe('undecodable');
    }
    // Valid UTF-8, the replacement character included, is read as it is.
    const fine = Buffer.from(JSON.stringify({ ...event, tool: 'sea\uFFFDrch', session_id: 'ß✓😀' }));
    const o = { codec: jsonCodec(), parse, maxBytes: 1 << 20 };
    expect(verdict(decodeMessageSync({ key: null, value: fine }, 't', o))).toBe('ok');
  });

  it("dead-letters a framed message the registry's schema cannot read, instead of retrying it for good", async () => {
    const o = { codec: registryCodec({ url: registry.url }), parse, maxBytes: 1 << 20 };
    // An Avro writer schema and bytes that are not a record of it (truncated).
    registry.schemas.set(101, {
      schemaType: 'AVRO',
      schema: JSON.stringify({ type: 'record', name: 'R', fields: [{ name: 'a', type: 'string' }] }),
    });
    // A JSON Schema this client cannot compile (a draft it does not know): the same answer on every read.
    registry.schemas.set(102, {
      schemaType: 'JSON',
      schema: JSON.stringify({ $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'object' }),
    });
    for (const [id, payload] of [
      [101, Buffer.from([0x40])],
      [102, Buffer.from(JSON.stringify(event))],
    ] as const) {
      const r = await decodeMessage({ key: null, value: frame(id, payload) }, 't', o);
      expect(verdict(r)).toBe('registry_error');
    }
  });

  it('still retries when the registry itself does not answer', async () => {
    const o = { codec: registryCodec({ url: 'http://127.0.0.1:9' }), parse, maxBytes: 1 << 20 };
    const err = await decodeMessage({ key: null, value: frame(7, Buffer.from('{}')) }, 't', o).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(PaverError);
    expect((err as PaverError).code).toBe('REGISTRY_UNAVAILABLE');
  });
});

describe('registry codec: an outage is told from an answer', () => {
  it('encode: REGISTRY_UNAVAILABLE (retriable) while the registry is down, INTERNAL for an output its schema refuses', async () => {
    const codec = registryCodec({ url: registry.url });
    registry.setDown(true);
    try {
      const err = await codec.encode('tool-calls.v1', 'out-t', event).catch((e: unknown) => e);
      expect((err as PaverError).code).toBe('REGISTRY_UNAVAILABLE');
      await expect(codec.probe!()).rejects.toThrow(/503/);
    } finally {
      registry.setDown(false);
    }
    await codec.probe!();
    // The same answer at every try: waiting for the registry would hold the partition for good.
    const bad = await codec
      .encode('tool-calls.v1', 'out-t', { ...event, step: 'x' })
      .catch((e: unknown) => e);
    expect((bad as PaverError).code).toBe('INTERNAL');
    expect((bad as PaverError).retriable).toBe(false);
    await expect(registryCodec({ url: 'http://127.0.0.1:9' }).probe!()).rejects.toThrow();
  });
});

describe('registry codec: the outage probe', () => {
  it('answers for a SCHEMA_REGISTRY_URL with credentials in it, as the client takes it', async () => {
    // The client sends the URL's user:password as basic auth; fetch() refuses a URL with credentials
    // (TypeError), so the probe failed for good and a service that saw one outage stayed paused.
    const withCreds = registry.url.replace('http://', 'http://user:secret@');
    const codec = registryCodec({ url: withCreds });
    await codec.encode('tool-calls.v1', 'creds-t', event);
    await codec.probe!();
  });
});

describe('decode step: a codec that hands the bytes on', () => {
  it('does not walk the bytes as a JSON value (ingest parses OTLP itself)', async () => {
    let walked = 0;
    const bytes = new Proxy(Buffer.from('{"resourceSpans":[]}'), {
      ownKeys: (target) => {
        walked++;
        return Reflect.ownKeys(target);
      },
    });
    const o = {
      codec: {
        kind: 'json' as const,
        encode: () => Promise.reject(new Error('never encodes')),
        decode: () => Promise.resolve(bytes),
      },
      parse: (value: unknown) => ({ ok: true as const, value }),
      maxBytes: 1 << 20,
    };
    const r = await decodeMessage({ key: null, value: Buffer.from('{"resourceSpans":[]}') }, 't', o);
    expect(r.ok && r.value).toBe(bytes);
    // Each byte was visited as a key: for a 1 MiB message, several times the cost of decoding it.
    expect(walked).toBe(0);
  });
});
