import protobuf from 'protobufjs';
import { describe, expect, it } from 'vitest';
import { id as idSchema, toolCallsEventV1 } from '../../../../schemas/index.js';
import { decodeOtlp } from '../../src/adapters/otlp-decode.js';
import {
  DEFAULT_MAP_OPTIONS,
  byTrace,
  keepSpan,
  cleanId,
  mapSpans,
  resolveTrace,
  type KeptSpan,
  type MapOptions,
} from '../../src/core/map.js';
import { DEFAULT_DECODE_LIMITS, anyValue, spansFromRequest, type OtlpSpan } from '../../src/core/otlp.js';
import { parseExport } from '../../src/cli.js';
import { otelRecorder, toJson, toProto } from '../helpers/otel.js';

const decode = (buf: Buffer, enc: 'auto' | 'otlp_json' | 'otlp_proto' = 'auto'): OtlpSpan[] => {
  const r = decodeOtlp(buf, enc, DEFAULT_DECODE_LIMITS);
  if (!r.ok) throw new Error(`${r.reason}: ${r.detail}`);
  return r.spans;
};

const booking = {
  name: 'Travel Agent',
  id: 'asst_42',
  conversationId: 'conv-7',
  tools: [
    { name: 'get_user', callId: 'call_1', args: { user_id: 'u1' }, result: { name: 'Ann' } },
    { name: 'search', callId: 'call_2', args: { from: 'A', to: 'B' }, result: 'no flights', error: true },
    { name: 'book', args: ['not', 'an', 'object'] },
  ],
};

describe('OTLP GenAI spans → tool-calls events', () => {
  it('maps execute_tool spans under invoke_agent to tool_call events in start order, then task_completed', () => {
    const rec = otelRecorder();
    const spans = rec.agent(booking);
    const agentSpan = spans.find((s) => s.name.startsWith('invoke_agent'))!;
    const { traceId, spanId } = agentSpan.spanContext();
    const { events, stats } = mapSpans(decode(toJson(spans)), DEFAULT_MAP_OPTIONS);

    expect(stats).toMatchObject({ toolCalls: 3, tasks: 1, pending: 0, orphans: 0 });
    for (const e of events) expect(toolCallsEventV1.safeParse(e).success).toBe(true);
    const taskId = `otel-${traceId}-${spanId}`;
    expect(
      events.map((e) => [e.type, e.type === 'tool_call' ? e.tool : '', e.type === 'tool_call' ? e.step : -1]),
    ).toEqual([
      ['tool_call', 'get_user', 0],
      ['tool_call', 'search', 1],
      ['tool_call', 'book', 2],
      ['task_completed', '', -1],
    ]);
    for (const e of events)
      expect(e).toMatchObject({
        session_id: 'conv-7',
        agent_id: 'asst_42',
        tenant_id: 'default',
        task_id: taskId,
      });
    const [first, second, third, done] = events;
    expect(first).toMatchObject({ status: 'ok', args: { user_id: 'u1' }, observation: { name: 'Ann' } });
    expect(second).toMatchObject({ status: 'error', observation: 'no flights' });
    // Arguments that are not a JSON object are left out (the contract's args is an object).
    expect(third).not.toHaveProperty('args');
    expect(done).toMatchObject({
      type: 'task_completed',
      status: 'ok',
      ts: Number(agentSpan.endTime[0]) * 1000 + Math.floor(agentSpan.endTime[1] / 1e6),
    });
    const toolSpan = spans.find((s) => s.name === 'execute_tool get_user')!;
    expect(first!.event_id).toBe(`otel-${traceId}-${toolSpan.spanContext().spanId}`);
    expect(first!.ts).toBe(1_700_000_000_011);
  });

  it('decodes otlp_proto and otlp_json of the same spans to the same spans and events', () => {
    const spans = otelRecorder().agent(booking);
    const fromJson = decode(toJson(spans));
    const fromProto = decode(toProto(spans));
    expect(decodeOtlp(toProto(spans), 'auto', DEFAULT_DECODE_LIMITS).encoding).toBe('otlp_proto');
    expect(decodeOtlp(toJson(spans), 'auto', DEFAULT_DECODE_LIMITS).encoding).toBe('otlp_json');
    expect(fromProto).toEqual(fromJson);
    expect(decode(toProto(spans), 'otlp_proto')).toEqual(fromJson);
    expect(mapSpans(fromProto, DEFAULT_MAP_OPTIONS).events).toEqual(
      mapSpans(fromJson, DEFAULT_MAP_OPTIONS).events,
    );
    expect(fromJson.length).toBe(4);
  });

  it('falls back to agent name, then trace id for the session, and takes the tenant attribute', () => {
    const spans = otelRecorder().agent({ name: 'Helper', tenant: 'acme', tools: [{ name: 'lookup' }] });
    const { events } = mapSpans(decode(toProto(spans)), DEFAULT_MAP_OPTIONS);
    const traceId = spans[0]!.spanContext().traceId;
    expect(events[0]).toMatchObject({ agent_id: 'Helper', session_id: traceId, tenant_id: 'acme' });
  });

  it('finds the agent span through intermediate non-GenAI spans', () => {
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [{ name: 'one' }, { name: 'two', viaInternalSpan: true }, { name: 'three' }],
    });
    const { events } = mapSpans(decode(toJson(spans)), DEFAULT_MAP_OPTIONS);
    expect(events.filter((e) => e.type === 'tool_call').map((e) => (e as { tool: string }).tool)).toEqual([
      'one',
      'two',
      'three',
    ]);
  });

  it('names the spans a waiting tool span needs on its path, and no other', () => {
    const spans = decode(
      toJson(otelRecorder().agent({ name: 'A', tools: [{ name: 'two', viaInternalSpan: true }] })),
    ).map((s) => keepSpan(s, DEFAULT_MAP_OPTIONS).kept);
    const agent = spans.find((s) => s.kind === 'agent')!;
    const between = spans.find((s) => s.kind === 'link')!;
    // Beside the task, below the same (not yet known) parent as the agent span: no tool span's path.
    const beside: KeptSpan = { ...between, spanId: 'beside00beside00', parentSpanId: 'root0000root0000' };
    // The agent span has not come yet.
    const waiting = resolveTrace(
      [...spans.filter((s) => s !== agent), beside],
      new Set(),
      DEFAULT_MAP_OPTIONS,
    );
    expect(waiting.pendingTools).toHaveLength(1);
    expect(waiting.waitingLinks).toEqual([between.spanId]);
  });

  it('gives an agent invoked as a tool its own task; the outer task keeps the tool call', () => {
    const spans = otelRecorder().agent({
      name: 'Outer',
      conversationId: 'c1',
      tools: [
        { name: 'plan' },
        { name: 'ask_expert', subAgent: { name: 'Expert', tools: [{ name: 'read' }, { name: 'write' }] } },
        { name: 'reply' },
      ],
    });
    const { events } = mapSpans(decode(toJson(spans)), DEFAULT_MAP_OPTIONS);
    const byTask = new Map<string, string[]>();
    for (const e of events)
      byTask.set(e.task_id, [
        ...(byTask.get(e.task_id) ?? []),
        e.type === 'tool_call' ? `${e.agent_id}:${e.tool}` : 'done',
      ]);
    expect([...byTask.values()]).toEqual([
      ['Outer:plan', 'Outer:ask_expert', 'Outer:reply', 'done'],
      ['Expert:read', 'Expert:write', 'done'],
    ]);
    // The inner agent names no conversation: its task's session is the trace id. The outer agent's span comes
    // after the inner task is published (it ends later), so what it names cannot be the inner task's.
    const traceId = spans[0]!.spanContext().traceId;
    expect(events.map((e) => `${e.agent_id}:${e.session_id}`)).toEqual([
      ...Array<string>(4).fill('Outer:c1'),
      ...Array<string>(3).fill(`Expert:${traceId}`),
    ]);
  });

  it('counts an MCP tool call once: the MCP server span below the client span is part of that call', () => {
    // semantic-conventions-genai mcp.md, "Tool call": the MCP client span and the MCP server span below it
    // both carry gen_ai.operation.name = execute_tool and gen_ai.tool.name, for the one call the agent made.
    const spans = otelRecorder().agent({
      name: 'A',
      tools: [
        { name: 'get_user' },
        { name: 'get_weather', args: { city: 'Paris' }, mcpServer: true },
        { name: 'reply' },
      ],
    });
    const server = spans.find((s) => s.name === 'tools/call get_weather')!;
    expect(server).toBeDefined();
    const r = mapSpans(decode(toProto(spans)), DEFAULT_MAP_OPTIONS);
    expect(r.events.map((e) => (e.type === 'tool_call' ? `${e.step}:${e.tool}` : e.type))).toEqual([
      '0:get_user',
      '1:get_weather',
      '2:reply',
      'task_completed',
    ]);
    expect(r.events.map((e) => e.event_id)).not.toContain(
      `otel-${server.spanContext().traceId}-${server.spanContext().spanId}`,
    );
    expect(r.stats).toMatchObject({ toolCalls: 3, tasks: 1, pending: 0, orphans: 0, nested: 1 });

    // The server span exported first, alone (another process): it waits like any tool span whose parent is not
    // known yet, and is settled as nested once its parent comes, never a step.
    const keep = (ss: typeof spans) => decode(toProto(ss)).map((s) => keepSpan(s, DEFAULT_MAP_OPTIONS).kept);
    const first = resolveTrace(keep([server]), new Set(), DEFAULT_MAP_OPTIONS);
    expect(first.pendingTools).toHaveLength(1);
    const rest = spans.filter((s) => s !== server);
    const second = resolveTrace([...keep([server]), ...keep(rest)], new Set(), DEFAULT_MAP_OPTIONS);
    expect(second.events).toEqual(r.events);
    expect(second.nestedTools).toEqual([server.spanContext().spanId]);
    expect(second.pendingTools).toEqual([]);
  });

  it('waits for the agent span across messages, and ignores redeliveries once the task is done', () => {
    const spans = otelRecorder().agent(booking);
    const toolSpans = spans.filter((s) => s.name.startsWith('execute_tool'));
    const agentSpans = spans.filter((s) => s.name.startsWith('invoke_agent'));
    const keep = (ss: typeof spans) => decode(toProto(ss)).map((s) => keepSpan(s, DEFAULT_MAP_OPTIONS).kept);

    // Message 1: tool spans only (the agent span has not ended yet when the SDK exports them).
    const first = resolveTrace(keep(toolSpans), new Set(), DEFAULT_MAP_OPTIONS);
    expect(first.events).toEqual([]);
    expect(first.pendingTools).toHaveLength(3);
    // Message 2: the agent span, with the buffered tool spans.
    const buffered = keep(toolSpans).filter((s) => first.pendingTools.includes(s.spanId));
    const second = resolveTrace([...buffered, ...keep(agentSpans)], new Set(), DEFAULT_MAP_OPTIONS);
    const all = mapSpans(decode(toJson(spans)), DEFAULT_MAP_OPTIONS).events;
    expect(second.events).toEqual(all);
    // Redelivery of either message after completion: nothing new.
    const done = new Set(second.completedAgents);
    expect(resolveTrace(keep(agentSpans), done, DEFAULT_MAP_OPTIONS).events).toEqual([]);
    const late = resolveTrace([...keep(toolSpans), ...keep(agentSpans)], done, DEFAULT_MAP_OPTIONS);
    expect(late.events).toEqual([]);
    expect(late.lateTools).toHaveLength(3);
    // The tool spans alone, after completion (the agent span is not kept, only its id): late too, not buffered
    // as pending for hours.
    const alone = resolveTrace(keep(toolSpans), done, DEFAULT_MAP_OPTIONS);
    expect(alone.pendingTools).toEqual([]);
    expect(alone.lateTools).toHaveLength(3);
  });

  it('produces nothing for tool spans outside any agent span, and ignores other spans', () => {
    const rec = otelRecorder();
    const orphan = rec.lone('execute_tool x', {
      'gen_ai.operation.name': 'execute_tool',
      'gen_ai.tool.name': 'x',
    });
    const http = rec.lone('GET /', { 'http.request.method': 'GET' });
    const r = mapSpans(decode(toJson([...orphan, ...http])), DEFAULT_MAP_OPTIONS);
    expect(r.events).toEqual([]);
    expect(r.stats.orphans).toBe(1);
  });

  it('is deterministic: the same spans give the same events and ids', () => {
    const spans = otelRecorder().agent(booking);
    const a = mapSpans(decode(toJson(spans)), DEFAULT_MAP_OPTIONS).events;
    const b = mapSpans(decode(toJson([...spans].reverse())), DEFAULT_MAP_OPTIONS).events;
    expect(b).toEqual(a);
  });
});

describe('identifiers cleaned to the contract', () => {
  it('control characters go, unpaired surrogates become U+FFFD, a cut never splits a pair', () => {
    expect(cleanId('a\u0001b')).toBe('ab');
    expect(cleanId('s\ud800x')).toBe('s\ufffdx');
    expect(cleanId('\udc00')).toBe('\ufffd');
    expect(cleanId('ab\ud83d\ude00', 3)).toBe('ab');
    expect(cleanId('ab\ud83d\ude00', 4)).toBe('ab\ud83d\ude00');
    for (const raw of ['x'.repeat(255) + '\ud83d\ude00', 's\ud800', 'a\udc00\ud800b'])
      expect(idSchema.safeParse(cleanId(raw)).success, raw).toBe(true);
  });
});

describe('payload limits', () => {
  const big = { blob: 'x'.repeat(2000) };
  const spans = otelRecorder().agent({ name: 'A', tools: [{ name: 't', args: big, result: big }] });

  it('leaves out arguments and results over the size limit, with a reason', () => {
    const opts: MapOptions = { ...DEFAULT_MAP_OPTIONS, maxPayloadBytes: 1000 };
    const r = mapSpans(decode(toJson(spans)), opts);
    expect(r.events[0]).not.toHaveProperty('args');
    expect(r.events[0]).not.toHaveProperty('observation');
    expect(r.notes).toEqual([
      { field: 'args', reason: 'oversize' },
      { field: 'observation', reason: 'oversize' },
    ]);
  });

  it('copies no payload at all when payloads are off', () => {
    const r = mapSpans(decode(toJson(spans)), { ...DEFAULT_MAP_OPTIONS, includePayloads: false });
    expect(r.events[0]).not.toHaveProperty('args');
    expect(r.events[0]).not.toHaveProperty('observation');
    expect(r.events[0]).toMatchObject({ type: 'tool_call', tool: 't' });
  });

  it('publishes no payload of a tool span that waited while payloads were on, once they are off', () => {
    const kept = decode(toProto(spans)).map((s) => keepSpan(s, DEFAULT_MAP_OPTIONS).kept);
    // The tool span, kept (in Redis) by a service that copied payloads, its agent span read after a restart with
    // INGEST_INCLUDE_PAYLOADS=false.
    expect(kept.find((s) => s.kind === 'tool')).toHaveProperty('args');
    const r = resolveTrace(kept, new Set(), { ...DEFAULT_MAP_OPTIONS, includePayloads: false });
    expect(r.events[0]).toMatchObject({ type: 'tool_call', tool: 't' });
    expect(r.events[0]).not.toHaveProperty('args');
    expect(r.events[0]).not.toHaveProperty('observation');
  });
  it('applies the limit in force when a kept tool span is published, measured as when it was read', () => {
    // Arguments as the agent wrote them, spaced: 30 bytes read, fewer once parsed and written again. The result is text.
    const argsText = '{ "city" : "Paris" , "n" : 1 }';
    const recorded = otelRecorder().agent({
      name: 'A',
      tools: [{ name: 't', args: {}, result: 'r'.repeat(25) }],
    });
    const at = (maxPayloadBytes: number): MapOptions => ({ ...DEFAULT_MAP_OPTIONS, maxPayloadBytes });
    const read = decode(toProto(recorded)).map((s) =>
      s.attributes['gen_ai.tool.call.arguments'] === undefined
        ? s
        : { ...s, attributes: { ...s.attributes, 'gen_ai.tool.call.arguments': argsText } },
    );
    // Kept (in Redis) by a service with the default 64 KiB limit, published after a restart with a smaller one.
    const stored = read.map(
      (s) => JSON.parse(JSON.stringify(keepSpan(s, DEFAULT_MAP_OPTIONS).kept)) as KeptSpan,
    );
    for (const limit of [20, 24, 25, 29, 30]) {
      const fresh = mapSpans(read, at(limit));
      const waited = resolveTrace(stored, new Set(), at(limit));
      // Before, the span that waited kept both payloads whatever the limit now.
      expect(waited.events[0], `limit ${limit}`).toEqual(fresh.events[0]);
      expect(waited.notes, `limit ${limit}`).toEqual(fresh.notes);
    }
    expect(resolveTrace(stored, new Set(), at(29)).events[0]).not.toHaveProperty('args');
    expect(resolveTrace(stored, new Set(), at(29)).events[0]).toHaveProperty('observation');
    expect(resolveTrace(stored, new Set(), at(24)).notes).toEqual([
      { field: 'args', reason: 'oversize' },
      { field: 'observation', reason: 'oversize' },
    ]);
    expect(resolveTrace(stored, new Set(), at(30)).events[0]).toMatchObject({
      args: { city: 'Paris', n: 1 },
      observation: 'r'.repeat(25),
    });
  });

  it('measures a span kept by an older version (no recorded size) by its value written again', () => {
    const kept = decode(toProto(spans)).map((s) => keepSpan(s, DEFAULT_MAP_OPTIONS).kept);
    const old = kept.map((s) => {
      const o = { ...s };
      delete o.argsBytes;
      delete o.observationBytes;
      return o;
    });
    const r = resolveTrace(old, new Set(), { ...DEFAULT_MAP_OPTIONS, maxPayloadBytes: 1000 });
    expect(r.events[0]).toMatchObject({ type: 'tool_call', tool: 't' });
    expect(r.events[0]).not.toHaveProperty('args');
    expect(r.events[0]).not.toHaveProperty('observation');
  });
});

describe('bad input', () => {
  const limits = DEFAULT_DECODE_LIMITS;
  it('refuses bytes that are neither OTLP JSON nor OTLP protobuf', () => {
    expect(decodeOtlp(Buffer.from([0xff, 0xff, 0xff, 0x01]), 'auto', limits)).toMatchObject({
      ok: false,
      reason: 'undecodable',
    });
    expect(decodeOtlp(Buffer.from('{"not json'), 'otlp_json', limits)).toMatchObject({
      ok: false,
      reason: 'undecodable',
    });
  });
  it('refuses JSON that is not a trace request, naming paths, never values', () => {
    expect(decodeOtlp(Buffer.from('{"type":"tool_call"}'), 'auto', limits)).toMatchObject({
      ok: false,
      reason: 'invalid',
    });
    const spans = otelRecorder().agent(booking);
    const doc = JSON.parse(toJson(spans).toString()) as {
      resourceSpans: { scopeSpans: { spans: { traceId: string }[] }[] }[];
    };
    doc.resourceSpans[0]!.scopeSpans[0]!.spans = 'secret-value' as never;
    const r = decodeOtlp(Buffer.from(JSON.stringify(doc)), 'auto', limits);
    expect(r).toMatchObject({ ok: false, reason: 'invalid' });
    expect(JSON.stringify(r)).not.toContain('secret-value');
    expect(JSON.stringify(r)).toContain('spans');
  });
  it('counts a span with a malformed id as invalid and keeps the other spans of its request', () => {
    const spans = otelRecorder().agent(booking);
    const whole = decode(toProto(spans));
    const doc = JSON.parse(toJson(spans).toString()) as {
      resourceSpans: { scopeSpans: { spans: { traceId: string; spanId: string }[] }[] }[];
    };
    const list = doc.resourceSpans[0]!.scopeSpans[0]!.spans;
    expect(list.length).toBe(whole.length);
    list[0]!.traceId = 'secret-value';
    list[1]!.spanId = 'abcd';
    const r = decodeOtlp(Buffer.from(JSON.stringify(doc)), 'auto', limits);
    // Before: the whole request was dead-lettered as invalid, every good span in it lost.
    expect(r).toMatchObject({ ok: true, invalid: 2 });
    expect(r.ok && r.spans).toEqual(whole.slice(2));
    // What was wrong names paths, never values.
    const { invalidDetail } = spansFromRequest(doc);
    expect(invalidDetail).toContain('traceId');
    expect(invalidDetail).not.toContain('secret-value');
    // Protobuf: ids of the wrong length (a span: traceId 1, spanId 2, startTimeUnixNano 7; in scopeSpans 2, in
    // resourceSpans 2, in the request 1).
    const span = (traceId: number, spanId: number) =>
      protobuf.Writer.create()
        .uint32(10)
        .bytes(Buffer.alloc(traceId, 1))
        .uint32(18)
        .bytes(Buffer.alloc(spanId, 2))
        .uint32(57)
        .fixed64(1)
        .finish();
    const scope = protobuf.Writer.create();
    for (const sp of [span(16, 8), span(15, 8), span(16, 9), span(16, 8)]) scope.uint32(18).bytes(sp);
    const rs = protobuf.Writer.create().uint32(18).bytes(scope.finish()).finish();
    const p = decodeOtlp(protobuf.Writer.create().uint32(10).bytes(rs).finish(), 'otlp_proto', limits);
    expect(p).toMatchObject({ ok: true, invalid: 2 });
    expect(p.ok && p.spans).toHaveLength(2);
  });
  it('takes 64-bit times written as JSON numbers (the proto3 JSON mapping allows them) as their strings', () => {
    const text = toJson(otelRecorder().agent(booking)).toString();
    const numeric = text.replace(/"(start|end)TimeUnixNano":"(\d+)"/g, '"$1TimeUnixNano":$2');
    expect(numeric).not.toBe(text);
    const a = mapSpans(decode(Buffer.from(text)), DEFAULT_MAP_OPTIONS).events;
    const b = mapSpans(decode(Buffer.from(numeric)), DEFAULT_MAP_OPTIONS).events;
    expect(b.length).toBeGreaterThan(0);
    expect(b).toEqual(a);
    expect(
      decodeOtlp(
        Buffer.from(numeric.replace(/"startTimeUnixNano":\d+/, '"startTimeUnixNano":1.5')),
        'auto',
        limits,
      ),
    ).toMatchObject({ ok: true, invalid: 1 });
  });
  it('refuses protobuf bytes with no field of a trace request, and takes an empty request', () => {
    // Field 2 (varint) and field 5 (bytes): a message of another type decodes with every field unknown, and was
    // taken as a request with no spans.
    const other = Buffer.from([0x10, 0x01, 0x2a, 0x02, 0x68, 0x69]);
    for (const enc of ['auto', 'otlp_proto'] as const) {
      const r = decodeOtlp(other, enc, limits);
      expect(r).toMatchObject({ ok: false, reason: 'invalid', encoding: 'otlp_proto' });
      expect(!r.ok && r.detail).toContain('resourceSpans');
      expect(decodeOtlp(Buffer.alloc(0), enc, limits)).toMatchObject({ ok: true, spans: [] });
    }
    // One resourceSpans with nothing in it is a known field: a valid request, no spans.
    expect(decodeOtlp(Buffer.from([0x0a, 0x00]), 'otlp_proto', limits)).toMatchObject({
      ok: true,
      spans: [],
    });
  });
  it('refuses a request with more spans than the limit', () => {
    const spans = otelRecorder().agent(booking);
    expect(decodeOtlp(toProto(spans), 'auto', { ...limits, maxSpans: 3 })).toMatchObject({
      ok: false,
      reason: 'oversize',
    });
  });
});

describe('paver otel input files', () => {
  it('leaves out a malformed span of a request and keeps the rest, with a warning naming paths only', () => {
    const spans = otelRecorder().agent(booking);
    const doc = JSON.parse(toJson(spans).toString()) as {
      resourceSpans: { scopeSpans: { spans: { spanId: string }[] }[] }[];
    };
    doc.resourceSpans[0]!.scopeSpans[0]!.spans[0]!.spanId = 'secret-value';
    const warnings: string[] = [];
    const r = parseExport(JSON.stringify(doc), (w) => warnings.push(w));
    // Before: the request was bad, none of its spans mapped.
    expect(r).toMatchObject({ requests: 1, bad: 0, invalid: 1 });
    expect(r.spans).toHaveLength(spans.length - 1);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain('spanId');
    expect(warnings[0]).not.toContain('secret-value');
  });
  it('reads one request per line (the Collector file exporter) and counts bad lines', () => {
    const rec = otelRecorder();
    const a = rec.agent(booking);
    const b = rec.agent({ name: 'B', tools: [{ name: 'x' }] });
    const text = `${toJson(a).toString()}\nnot json\n${toJson(b).toString()}\n`;
    const warnings: string[] = [];
    const parsed = parseExport(text, (s) => warnings.push(s));
    expect(parsed).toMatchObject({ requests: 2, bad: 1 });
    expect(warnings).toEqual(['line 2: not valid JSON']);
    const traces = byTrace(parsed.spans.map((s) => keepSpan(s, DEFAULT_MAP_OPTIONS).kept as KeptSpan));
    expect(traces.size).toBe(2);
  });
});

describe('attribute keys are the producer\u2019s', () => {
  it('a `__proto__` attribute or argument stays a key: it adds no attribute and loses no argument', () => {
    const attr = (key: string, value: unknown) => ({ key, value });
    const str = (s: string) => ({ stringValue: s });
    const kv = (...values: unknown[]) => ({ kvlistValue: { values } });
    const span = (spanId: string, name: string, attributes: unknown[]) => ({
      traceId: '0af7651916cd43dd8448eb211c80319c',
      spanId,
      parentSpanId: 'b7ad6b7169203331',
      name,
      startTimeUnixNano: '2000000000',
      endTimeUnixNano: '3000000000',
      attributes,
    });
    const request = {
      resourceSpans: [
        {
          resource: { attributes: [attr('constructor', str('acme'))] },
          scopeSpans: [
            {
              spans: [
                {
                  ...span('b7ad6b7169203331', 'agent', [attr('gen_ai.operation.name', str('invoke_agent'))]),
                  parentSpanId: undefined,
                },
                span('00f067aa0ba902b7', 'tool', [
                  attr('gen_ai.operation.name', str('execute_tool')),
                  attr('gen_ai.tool.name', str('lookup')),
                  attr(
                    'gen_ai.tool.call.arguments',
                    kv(attr('q', str('a')), attr('__proto__', kv(attr('x', str('1'))))),
                  ),
                ]),
                // Before: this plain span's `__proto__` attribute became its attributes' prototype, and it was read
                // as a tool call of `injected`.
                span('00f067aa0ba902b8', 'plain span', [
                  attr(
                    '__proto__',
                    kv(
                      attr('gen_ai.operation.name', str('execute_tool')),
                      attr('gen_ai.tool.name', str('injected')),
                    ),
                  ),
                ]),
              ],
            },
          ],
        },
      ],
    };
    const parsed = parseExport(JSON.stringify(request), () => undefined);
    const { events } = mapSpans(parsed.spans, { ...DEFAULT_MAP_OPTIONS, tenantAttribute: 'constructor' });
    const calls = events.filter((e) => e.type === 'tool_call');
    expect(calls.map((e) => e.tool)).toEqual(['lookup']);
    const args = calls[0]!.type === 'tool_call' ? calls[0]!.args : undefined;
    expect(Object.keys(args ?? {}).sort()).toEqual(['__proto__', 'q']);
    // Before: the tenant attribute `constructor` read Object's constructor and the resource's tenant was lost.
    expect(calls[0]!.tenant_id).toBe('acme');
  });
});

describe('statuses and structured values', () => {
  it('takes span status ERROR without error.type as an error, and UNSET as ok', () => {
    const spans = otelRecorder().agent({ name: 'A', error: true, tools: [{ name: 't' }] });
    const { events } = mapSpans(decode(toProto(spans)), DEFAULT_MAP_OPTIONS);
    expect(events.map((e) => [e.type, e.status])).toEqual([
      ['tool_call', 'ok'],
      ['task_completed', 'error'],
    ]);
  });

  it('reads structured (kvlist) argument values as objects', () => {
    // The JS SDK only records primitive attributes; other SDKs record `any` values as kvlists.
    const kv = {
      kvlistValue: {
        values: [
          { key: 'id', value: { intValue: '7' } },
          { key: 'q', value: { arrayValue: { values: [{ stringValue: 'a' }] } } },
        ],
      },
    };
    expect(anyValue(kv, 0, 16)).toEqual({ id: 7, q: ['a'] });
    expect(() => anyValue(kv, 0, 1)).toThrow(/nested deeper/);
  });

  it('leaves out an attribute value nested too deep, not the request: its other spans and traces are mapped', () => {
    // A structured result (the conventions ask for one) of a tool that returns a tree, 40 levels deep, in a request
    // the Collector batched with another trace. The whole request was dead-lettered as invalid: every span of
    // every trace in it lost.
    const rec = otelRecorder();
    const deep = rec.agent({ name: 'A', tools: [{ name: 'parse' }, { name: 'reply' }] });
    const other = rec.agent({ name: 'B', tools: [{ name: 'lookup' }] });
    const request = JSON.parse(toJson([...deep, ...other]).toString()) as {
      resourceSpans: { scopeSpans: { spans: { name: string; attributes: unknown[] }[] }[] }[];
    };
    let tree: unknown = { stringValue: 'leaf' };
    for (let i = 0; i < 40; i++) tree = { kvlistValue: { values: [{ key: 'child', value: tree }] } };
    const spans = request.resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans));
    spans
      .find((sp) => sp.name === 'execute_tool parse')!
      .attributes.push({ key: 'gen_ai.tool.call.result', value: tree });
    const r = decodeOtlp(Buffer.from(JSON.stringify(request)), 'auto', DEFAULT_DECODE_LIMITS);
    expect(r.ok).toBe(true);
    const { events, notes } = mapSpans(r.ok ? r.spans : [], DEFAULT_MAP_OPTIONS);
    expect(events.map((e) => (e.type === 'tool_call' ? `${e.agent_id}:${e.tool}` : e.type))).toEqual([
      'A:parse',
      'A:reply',
      'task_completed',
      'B:lookup',
      'task_completed',
    ]);
    expect(events[0]).not.toHaveProperty('observation');
    expect(notes).toEqual([{ field: 'observation', reason: 'too_deep' }]);
  });
});

describe('paver otel on a large export', () => {
  it('reads one export document of 200,000 spans (push(...spans) overflowed the stack and dropped the document)', () => {
    const span = (i: number) => ({
      traceId: '0'.repeat(31) + '1',
      spanId: i.toString(16).padStart(16, '0'),
      name: 'http',
      startTimeUnixNano: '1700000000000000000',
    });
    const doc = {
      resourceSpans: [{ scopeSpans: [{ spans: Array.from({ length: 200_000 }, (_, i) => span(i + 1)) }] }],
    };
    const warnings: string[] = [];
    // A bound as large as --max-spans-per-message takes (by default the command refuses it, as the service does).
    const r = parseExport(JSON.stringify(doc), (w) => warnings.push(w), 1_000_000);
    expect(warnings).toEqual([]);
    expect(r).toMatchObject({ requests: 1, bad: 0 });
    expect(r.spans).toHaveLength(200_000);
  });

  it('names --max-spans-per-message when a request is over it, so a refused export says how to take it', () => {
    const span = (i: number) => ({
      traceId: '0'.repeat(31) + '1',
      spanId: i.toString(16).padStart(16, '0'),
      name: 'http',
      startTimeUnixNano: '1700000000000000000',
    });
    const doc = {
      resourceSpans: [{ scopeSpans: [{ spans: Array.from({ length: 12 }, (_, i) => span(i + 1)) }] }],
    };
    const warnings: string[] = [];
    expect(parseExport(JSON.stringify(doc), (w) => warnings.push(w), 10)).toMatchObject({
      requests: 0,
      bad: 1,
    });
    // Before: "input: 12 spans in one request > 10", which named no flag.
    expect(warnings).toEqual([expect.stringContaining('--max-spans-per-message')]);
    // A request refused for another reason names no flag.
    const other: string[] = [];
    parseExport('{"resourceSpans": 7}', (w) => other.push(w), 10);
    expect(other).toHaveLength(1);
    expect(other[0]).not.toContain('--max-spans-per-message');
  });
});

describe('chains of parents', () => {
  const hex = (n: number) => n.toString(16).padStart(16, '0');
  const span = (n: number, parent: number | null, kind: KeptSpan['kind']): KeptSpan => ({
    traceId: 'a'.repeat(32),
    spanId: hex(n),
    parentSpanId: parent === null ? null : hex(parent),
    kind,
    startNs: String(1_700_000_000_000_000_000n + BigInt(n)),
    endNs: String(1_700_000_000_000_000_000n + BigInt(n) + 1n),
    status: 'ok',
    ...(kind === 'tool' ? { tool: 'x' } : {}),
  });

  it('resolves a chain of 5,000 links with 5,000 tool spans below it: waiting, then published whole', () => {
    // 1 is the agent span; links 2..5001 each below the one before; tool spans 10001..15000 below the last link.
    const links = Array.from({ length: 5000 }, (_, i) => span(i + 2, i + 1, 'link'));
    const tools = Array.from({ length: 5000 }, (_, j) => span(10_001 + j, 5001, 'tool'));
    const waiting = resolveTrace([...tools, ...links], new Set(), DEFAULT_MAP_OPTIONS);
    expect(waiting.pendingTools).toHaveLength(5000);
    expect(waiting.waitingLinks).toHaveLength(5000);
    expect(waiting.events).toHaveLength(0);
    const r = resolveTrace([...tools, ...links, span(1, null, 'agent')], new Set(), DEFAULT_MAP_OPTIONS);
    expect(r.emittedTools).toHaveLength(5000);
    expect(r.spentLinks).toHaveLength(5000);
    expect(r.events).toHaveLength(5001);
    expect(r.pendingTools).toHaveLength(0);
    const late = resolveTrace([...tools, ...links], new Set([hex(1)]), DEFAULT_MAP_OPTIONS);
    expect(late.lateTools).toHaveLength(5000);
    expect(late.spentLinks).toHaveLength(5000);
  });

  it('reads a cycle of parents as no agent span, and a tool span met in it as the call of another', () => {
    // 2 ↔ 3 (links), a tool below; tool 4 ↔ link 5; tool 6 below link 5 meets tool 4.
    const r = resolveTrace(
      [
        span(2, 3, 'link'),
        span(3, 2, 'link'),
        span(7, 3, 'tool'),
        span(4, 5, 'tool'),
        span(5, 4, 'link'),
        span(6, 5, 'tool'),
      ],
      new Set(),
      DEFAULT_MAP_OPTIONS,
    );
    expect(r.orphanTools.sort()).toEqual([hex(4), hex(7)]);
    expect(r.nestedTools).toEqual([hex(6)]);
    expect(r.pendingTools).toEqual([]);
    expect(r.spentLinks).toEqual([]);
  });
});
