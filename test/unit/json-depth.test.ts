import { mkdtemp, writeFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1 } from '../../schemas/index.js';
import { jsonCodec } from '../../shared/codec.js';
import { deeperThan } from '../../shared/core/json-depth.js';
import { readEvents, type ReadStats } from '../../shared/jsonl.js';
import { decodeMessage, decodeMessageSync, zodParser } from '../../shared/kafka/decode.js';
import { applyEvent, MemoryLearnStore } from '../../services/autoseq/src/core/learn/engine.js';
import { DEFAULT_MAP_OPTIONS, keepSpan } from '../../services/ingest/src/core/map.js';
import { decodeOtlp } from '../../services/ingest/src/adapters/otlp-decode.js';
import { DEFAULT_DECODE_LIMITS } from '../../services/ingest/src/core/otlp.js';
import { otelRecorder, toJson } from '../../services/ingest/test/helpers/otel.js';

/** `[[[…]]]`, `n` levels: past about 5,000, JSON.stringify of what JSON.parse read overflows the stack. */
const nested = (n: number) => '['.repeat(n) + ']'.repeat(n);
const event = (args: string) =>
  `{"type":"tool_call","event_id":"e1","ts":1,"session_id":"s","task_id":"t","step":0,"tool":"x","args":{"a":${args}}}`;

describe('JSON nested too deep to write back', () => {
  it('deeperThan counts levels and stops at the limit, whatever the depth', () => {
    expect(deeperThan(JSON.parse(nested(256)))).toBe(false);
    expect(deeperThan(JSON.parse(nested(257)))).toBe(true);
    expect(deeperThan({ a: [{ b: 1 }] }, 3)).toBe(false);
    expect(deeperThan({ a: [{ b: {} }] }, 3)).toBe(true);
    expect(deeperThan('[[[[')).toBe(false);
    expect(deeperThan(JSON.parse(nested(200_000)))).toBe(true);
    expect(() => JSON.stringify(JSON.parse(nested(10_000)))).toThrow(RangeError);
  });

  it('a Kafka record is dead-lettered (invalid), not read: every service writes back what it reads', async () => {
    const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
    const o = { codec: jsonCodec(), parse, maxBytes: 1 << 20 };
    const deep = { key: null, value: Buffer.from(event(nested(10_000))) };
    const want = { ok: false, reason: 'invalid', detail: 'nested deeper than 256 levels' };
    expect(decodeMessageSync(deep, 't', o)).toEqual(want);
    expect(await decodeMessage(deep, 't', o)).toEqual(want);
    // 254 levels inside `args.a` (256 with the event and args): read.
    const fine = { key: null, value: Buffer.from(event(nested(254))) };
    expect(decodeMessageSync(fine, 't', o)).toMatchObject({ ok: true });
  });

  it('an offline input line is refused with its line number, its ids still given for the commands that answer each call', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'paver-depth-'));
    try {
      const file = join(dir, 'in.jsonl');
      const argsText = JSON.stringify(nested(10_000));
      await writeFile(
        file,
        [
          event(nested(10_000)),
          event('1').replace('"args":{"a":1}', `"args":${argsText}`).replace('"e1"', '"e2"'),
          event('1').replace('"e1"', '"e3"'),
        ].join('\n') + '\n',
      );
      const stats: ReadStats = { lines: 0, bad: 0 };
      const warnings: string[] = [];
      const bad: unknown[] = [];
      const got: string[] = [];
      for await (const e of readEvents(
        file,
        stats,
        (w) => warnings.push(w),
        (raw) => bad.push(raw),
      ))
        got.push(e.event_id);
      expect(got).toEqual(['e3']);
      expect(stats.bad).toBe(2);
      expect(warnings).toEqual([
        'line 1: nested deeper than 256 levels',
        'line 2: args nested deeper than 256 levels',
      ]);
      expect(bad).toEqual([
        { type: 'tool_call', event_id: 'e1', session_id: 's', task_id: 't' },
        { type: 'tool_call', event_id: 'e2', session_id: 's', task_id: 't' },
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("ingest leaves out a tool's arguments or result given as JSON text nested too deep (counted), and keeps the call", () => {
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [{ name: 'fetch', args: { url: 'u' }, result: nested(10_000) }],
    });
    const decoded = decodeOtlp(toJson(spans), 'otlp_json', DEFAULT_DECODE_LIMITS);
    if (!decoded.ok) throw new Error(decoded.detail);
    const tool = decoded.spans.find((s) => s.name.startsWith('execute_tool'))!;
    const { kept, notes } = keepSpan(tool, DEFAULT_MAP_OPTIONS);
    expect(notes).toEqual([{ field: 'observation', reason: 'too_deep' }]);
    expect(kept).toMatchObject({ kind: 'tool', tool: 'fetch' });
    expect(() => JSON.stringify(kept)).not.toThrow();
  });

  it('a payload ingest keeps still passes every consumer inside its event (one level down): the limit less one', () => {
    const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
    const o = { codec: jsonCodec(), parse, maxBytes: 1 << 20 };
    const keep = (depth: number) => {
      const spans = otelRecorder().agent({
        name: 'A',
        tools: [{ name: 'fetch', args: { url: 'u' }, result: nested(depth) }],
      });
      const decoded = decodeOtlp(toJson(spans), 'otlp_json', DEFAULT_DECODE_LIMITS);
      if (!decoded.ok) throw new Error(decoded.detail);
      return keepSpan(
        decoded.spans.find((s) => s.name.startsWith('execute_tool'))!,
        DEFAULT_MAP_OPTIONS,
      );
    };
    // Before: a result exactly 256 deep was kept, and its event (257) dead-lettered by every service.
    expect(keep(256).notes).toEqual([{ field: 'observation', reason: 'too_deep' }]);
    const kept = keep(255);
    expect(kept.notes).toEqual([]);
    const text = `{"type":"tool_call","event_id":"e1","ts":1,"session_id":"s","task_id":"t","step":0,"tool":"x","observation":${JSON.stringify(kept.kept.observation)}}`;
    expect(decodeMessageSync({ key: null, value: Buffer.from(text) }, 't', o)).toMatchObject({ ok: true });
  });

  it('autoseq reads a result of JSON text nested too deep as text: the task it keeps can be written back (to Redis)', () => {
    const store = new MemoryLearnStore();
    const base = { ts: 1, session_id: 's', task_id: 't' };
    const call = (event_id: string, step: number, observation: string) =>
      toolCallsEventV1.parse({
        ...base,
        type: 'tool_call',
        event_id,
        step,
        tool: 'fetch',
        args: { q: 'x' },
        observation,
      });
    applyEvent(store, call('a', 0, nested(10_000)));
    applyEvent(store, call('b', 1, 'ok'));
    const task = store.task('default', 'default', 't');
    expect(task.calls.map((c) => c.observation)).toEqual([nested(10_000), 'ok']);
    expect(() => JSON.stringify(task)).not.toThrow();
  });
});
