import { context, SpanStatusCode, trace, type Span } from '@opentelemetry/api';
import { decodeOtlp } from '../../src/adapters/otlp-decode.js';
import { DEFAULT_DECODE_LIMITS, type OtlpSpan } from '../../src/core/otlp.js';
import { JsonTraceSerializer, ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-base';

/**
 * Spans made by the official OpenTelemetry JS SDK, the way an instrumented agent makes them (GenAI
 * semantic conventions), and serialized by the official OTLP serializers. Times are explicit so the
 * tool order is known.
 */
export interface ToolSpec {
  name: string;
  callId?: string;
  /** Recorded as the JSON string the JS SDK allows (its attributes are primitives). */
  args?: unknown;
  result?: unknown;
  error?: boolean;
  /** Start in ms after the agent start; defaults to 10 ms per tool. */
  at?: number;
  /** Put a non-GenAI span between the agent span and this tool span. */
  viaInternalSpan?: boolean;
  /** An agent invoked as this tool (agent-as-a-tool). */
  subAgent?: AgentSpec;
  /**
   * The tool is called over MCP and the MCP server is instrumented too: below this span (the MCP client's
   * `tools/call`), the server's own `execute_tool` span of the same tool, as in the "Tool call" example of the
   * conventions' mcp.md.
   */
  mcpServer?: boolean;
}
export interface AgentSpec {
  name?: string;
  id?: string;
  conversationId?: string;
  tenant?: string;
  error?: boolean;
  tools: ToolSpec[];
}

export function otelRecorder(resource: Record<string, string> = { 'service.name': 'test-agent' }) {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes(resource),
    spanProcessors: [new SimpleSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer('paver-ingest-test', '1.0.0');

  function runAgent(a: AgentSpec, startMs: number, parent?: Span): number {
    const ctx = parent ? trace.setSpan(context.active(), parent) : context.active();
    const agent = tracer.startSpan(
      a.name ? `invoke_agent ${a.name}` : 'invoke_agent',
      {
        startTime: startMs,
        attributes: {
          'gen_ai.operation.name': 'invoke_agent',
          'gen_ai.provider.name': 'openai',
          ...(a.name ? { 'gen_ai.agent.name': a.name } : {}),
          ...(a.id ? { 'gen_ai.agent.id': a.id } : {}),
          ...(a.conversationId ? { 'gen_ai.conversation.id': a.conversationId } : {}),
          ...(a.tenant ? { 'paver.tenant_id': a.tenant } : {}),
        },
      },
      ctx,
    );
    const actx = trace.setSpan(context.active(), agent);
    let t = startMs;
    a.tools.forEach((tool, i) => {
      t = startMs + (tool.at ?? (i + 1) * 10);
      let pctx = actx;
      let between: Span | undefined;
      if (tool.viaInternalSpan) {
        between = tracer.startSpan('framework step', { startTime: t }, actx);
        pctx = trace.setSpan(context.active(), between);
      }
      const span = tracer.startSpan(
        `execute_tool ${tool.name}`,
        {
          startTime: t + 1,
          attributes: {
            'gen_ai.operation.name': 'execute_tool',
            'gen_ai.tool.name': tool.name,
            'gen_ai.tool.type': 'function',
            ...(tool.callId ? { 'gen_ai.tool.call.id': tool.callId } : {}),
            ...(tool.args !== undefined ? { 'gen_ai.tool.call.arguments': JSON.stringify(tool.args) } : {}),
            ...(tool.result !== undefined
              ? {
                  'gen_ai.tool.call.result':
                    typeof tool.result === 'string' ? tool.result : JSON.stringify(tool.result),
                }
              : {}),
          },
        },
        pctx,
      );
      if (tool.subAgent) runAgent(tool.subAgent, t + 2, span);
      if (tool.mcpServer)
        tracer
          .startSpan(
            `tools/call ${tool.name}`,
            {
              startTime: t + 2,
              attributes: {
                'gen_ai.operation.name': 'execute_tool',
                'gen_ai.tool.name': tool.name,
                'mcp.method.name': 'tools/call',
                ...(tool.args !== undefined
                  ? { 'gen_ai.tool.call.arguments': JSON.stringify(tool.args) }
                  : {}),
              },
            },
            trace.setSpan(context.active(), span),
          )
          .end(t + 4);
      if (tool.error) {
        span.setStatus({ code: SpanStatusCode.ERROR, message: 'tool failed' });
        span.setAttribute('error.type', 'ToolError');
      }
      span.end(t + 5);
      between?.end(t + 6);
    });
    if (a.error) agent.setStatus({ code: SpanStatusCode.ERROR });
    const end = t + 8;
    agent.end(end);
    return end;
  }

  return {
    /**
     * Runs an agent; returns its spans in export (end) order. With `within`, the agent runs inside a non-GenAI
     * span carrying those attributes (a request's root span), which ends, and is exported, after it.
     */
    agent(a: AgentSpec, startMs = 1_700_000_000_000, within?: Record<string, string>): ReadableSpan[] {
      exporter.reset();
      if (within) {
        const root = tracer.startSpan('POST /chat', { startTime: startMs - 1, attributes: within });
        root.end(runAgent(a, startMs, root) + 1);
      } else runAgent(a, startMs);
      return [...exporter.getFinishedSpans()];
    },
    /** A span outside any agent (an orphan tool span, or plain HTTP traffic). */
    lone(name: string, attributes: Record<string, string>, startMs = 1_700_000_000_000): ReadableSpan[] {
      exporter.reset();
      tracer.startSpan(name, { startTime: startMs, attributes }).end(startMs + 1);
      return [...exporter.getFinishedSpans()];
    },
  };
}

export const toJson = (spans: ReadableSpan[]): Buffer =>
  Buffer.from(JsonTraceSerializer.serializeRequest(spans)!);
export const toProto = (spans: ReadableSpan[]): Buffer =>
  Buffer.from(ProtobufTraceSerializer.serializeRequest(spans)!);

/** Recorded spans as the ingest adapter decodes them from an OTLP protobuf export. */
export function decodeRecorded(spans: ReadableSpan[]): OtlpSpan[] {
  const r = decodeOtlp(toProto(spans), 'auto', DEFAULT_DECODE_LIMITS);
  if (!r.ok) throw new Error(r.detail);
  return r.spans;
}

/**
 * Delivers span batches to an ingest batch handler as consecutive records of one partition, as the runner would:
 * one message per call, offsets counting up from 0.
 */
export function deliverTo(
  handle: (
    batch: {
      topic: string;
      partition: number;
      offset: string;
      key: null;
      timestamp: string;
      value: { spans: OtlpSpan[] };
    }[],
    ctx: { heartbeat: () => Promise<void>; isRunning: () => boolean },
  ) => Promise<unknown>,
): (spans: OtlpSpan[]) => Promise<unknown> {
  const ctx = { heartbeat: async () => undefined, isRunning: () => true };
  let offset = 0;
  return (spans) =>
    handle(
      [
        {
          topic: 'otlp',
          partition: 0,
          offset: String(offset++),
          key: null,
          timestamp: '0',
          value: { spans },
        },
      ],
      ctx,
    );
}
