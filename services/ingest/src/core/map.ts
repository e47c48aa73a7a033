import { own } from '../../../../shared/core/own.js';
import { cutText } from '../../../../shared/core/text.js';
import { deeperThan, PAYLOAD_DEPTH } from '../../../../shared/core/json-depth.js';
import { LIMITS } from '../../../../schemas/limits.js';
import type { TaskCompletedEvent, ToolCallEvent } from '../../../../schemas/index.js';
import { TOO_DEEP_VALUE, type OtlpSpan } from './otlp.js';

/** GenAI semantic-convention attribute names read by the mapping (semconv GenAI, Development status). */
export const ATTR = {
  operation: 'gen_ai.operation.name',
  toolName: 'gen_ai.tool.name',
  toolCallId: 'gen_ai.tool.call.id',
  toolArguments: 'gen_ai.tool.call.arguments',
  toolResult: 'gen_ai.tool.call.result',
  conversationId: 'gen_ai.conversation.id',
  agentId: 'gen_ai.agent.id',
  agentName: 'gen_ai.agent.name',
  errorType: 'error.type',
} as const;

export interface MapOptions {
  /** tenant_id when no span of the task (nor its resource) carries `tenantAttribute`. */
  defaultTenant: string;
  tenantAttribute: string;
  /** Off: args and observation are never copied (the events carry tool and order only). */
  includePayloads: boolean;
  /** UTF-8 bytes of one argument or result value; a larger one is left out of the event. */
  maxPayloadBytes: number;
}

export const DEFAULT_MAP_OPTIONS: MapOptions = {
  defaultTenant: 'default',
  tenantAttribute: 'paver.tenant_id',
  includePayloads: true,
  maxPayloadBytes: 64 * 1024,
};

/**
 * What the mapping keeps of a span, as plain JSON (the service buffers it in Redis between messages):
 * tool and agent spans with the fields the events need, every other span as a parent link only, so a
 * tool span can still find its agent span through intermediate spans.
 */
export interface KeptSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string | null;
  kind: 'tool' | 'agent' | 'link';
  /** Decimal nanoseconds (bigint does not survive JSON). */
  startNs: string;
  endNs: string;
  status: 'ok' | 'error';
  tool?: string;
  callId?: string;
  args?: Record<string, unknown>;
  observation?: unknown;
  /**
   * UTF-8 bytes of the argument and result values as read (the text measured against maxPayloadBytes), so a span
   * kept under one limit is measured the same way against the limit in force when its task is published.
   */
  argsBytes?: number;
  observationBytes?: number;
  agent?: string;
  session?: string;
  tenant?: string;
}

export type PayloadNote = {
  field: 'args' | 'observation';
  reason: 'oversize' | 'not_object' | 'not_json' | 'too_deep';
};

const utf8 = new TextEncoder();
// eslint-disable-next-line no-control-regex -- identifiers must be free of control characters (contract)
const CONTROL = /[\u0000-\u001f\u007f]/g;

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/**
 * Contract identifiers: control characters removed, an unpaired surrogate made U+FFFD (what UTF-8 makes of it
 * anyway; the contract refuses it), at most LIMITS.idLength characters without cutting a pair, never empty.
 */
export function cleanId(v: unknown, max: number = LIMITS.idLength): string | undefined {
  if (typeof v !== 'string' && typeof v !== 'number') return undefined;
  let s = String(v).replace(CONTROL, '').replace(LONE_SURROGATE, '\ufffd');
  s = cutText(s, max);
  return s.length > 0 ? s : undefined;
}

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** A recorded argument/result value: structured (kvlist) as is, or a JSON string parsed; `bytes`, its size as read. */
function payload(
  v: unknown,
  field: PayloadNote['field'],
  opts: MapOptions,
  notes: PayloadNote[],
): { value?: unknown; bytes?: number } {
  if (v === undefined) return {};
  if (v === TOO_DEEP_VALUE) {
    notes.push({ field, reason: 'too_deep' });
    return {};
  }
  const text = typeof v === 'string' ? v : JSON.stringify(v);
  const bytes = utf8.encode(text).length;
  if (bytes > opts.maxPayloadBytes) {
    notes.push({ field, reason: 'oversize' });
    return {};
  }
  if (typeof v !== 'string') return { value: v, bytes };
  try {
    const value = JSON.parse(v) as unknown;
    // Kept, it would be written back (to Redis, to the topic): past a few thousand levels that overflows the
    // stack, and the same spans would fail every restart.
    if (deeperThan(value, PAYLOAD_DEPTH)) {
      notes.push({ field, reason: 'too_deep' });
      return {};
    }
    return { value, bytes };
  } catch {
    // A plain-text result is still an observation; plain-text arguments are not an arguments object.
    if (field === 'observation') return { value: v, bytes };
    notes.push({ field, reason: 'not_json' });
    return {};
  }
}

/**
 * Size of a kept value against maxPayloadBytes: as measured when read, else (a span kept by a version that did
 * not record it) its text again, a string as itself, anything else as JSON.
 */
function keptPayloadBytes(value: unknown, bytes: number | undefined): number {
  if (bytes !== undefined) return bytes;
  return utf8.encode(typeof value === 'string' ? value : JSON.stringify(value)).length;
}

/** The kept form of one span, plus notes on payloads left out (for metrics: reasons only, no values). */
export function keepSpan(span: OtlpSpan, opts: MapOptions): { kept: KeptSpan; notes: PayloadNote[] } {
  const a = span.attributes;
  const op = a[ATTR.operation];
  const notes: PayloadNote[] = [];
  const status: KeptSpan['status'] =
    span.status === 'error' || (span.status === 'unset' && a[ATTR.errorType] !== undefined) ? 'error' : 'ok';
  const base: KeptSpan = {
    traceId: span.traceId,
    spanId: span.spanId,
    parentSpanId: span.parentSpanId,
    kind: 'link',
    startNs: span.startNs.toString(),
    endNs: span.endNs.toString(),
    status,
  };
  const session = cleanId(a[ATTR.conversationId]);
  const tenant = cleanId(own(a, opts.tenantAttribute) ?? own(span.resource, opts.tenantAttribute));
  const ids = { ...(session ? { session } : {}), ...(tenant ? { tenant } : {}) };
  const tool = op === 'execute_tool' ? cleanId(a[ATTR.toolName], LIMITS.toolNameLength) : undefined;
  if (tool) {
    const kept: KeptSpan = { ...base, kind: 'tool', tool, ...ids };
    const callId = cleanId(a[ATTR.toolCallId]);
    if (callId) kept.callId = callId;
    if (opts.includePayloads) {
      const args = payload(a[ATTR.toolArguments], 'args', opts, notes);
      if (args.value !== undefined) {
        if (isPlainObject(args.value)) {
          kept.args = args.value;
          kept.argsBytes = args.bytes;
        } else notes.push({ field: 'args', reason: 'not_object' });
      }
      const obs = payload(a[ATTR.toolResult], 'observation', opts, notes);
      if (obs.value !== undefined) {
        kept.observation = obs.value;
        kept.observationBytes = obs.bytes;
      }
    }
    return { kept, notes };
  }
  if (op === 'invoke_agent') {
    const agent = cleanId(a[ATTR.agentId]) ?? cleanId(a[ATTR.agentName]);
    return { kept: { ...base, kind: 'agent', ...(agent ? { agent } : {}), ...ids }, notes };
  }
  // Other spans: only the link (their conversation id or tenant is not read: see resolveTrace).
  return { kept: base, notes };
}

export interface ResolveResult {
  /** tool_call events of each completed task in step order, each task followed by its task_completed. */
  events: (ToolCallEvent | TaskCompletedEvent)[];
  /** Agent spans handled now: their tasks are complete (the service remembers them for redeliveries). */
  completedAgents: string[];
  /** Tool spans emitted now. */
  emittedTools: string[];
  /** Tool spans whose agent span has not been seen yet (the service buffers them). */
  pendingTools: string[];
  /** Tool spans whose agent span was already completed earlier (a redelivery, or exported late). */
  lateTools: string[];
  /** Tool spans with no invoke_agent span above them at all. */
  orphanTools: string[];
  /**
   * Tool spans below another tool span before any agent span: part of that tool call, not a call of their own
   * (an instrumented MCP server's span below the MCP client's, a framework's execute_tool around the MCP client).
   */
  nestedTools: string[];
  /** Agent spans whose task had no tool call: they complete without events. */
  emptyAgents: number;
  /**
   * Non-GenAI spans whose chain of parents reaches an agent span completed now or earlier: no tool span waits
   * for them any more (a tool span below one is late), so the service keeps only their id, as done.
   */
  spentLinks: string[];
  /**
   * Non-GenAI spans on the path from a waiting tool span up to the first unknown span: what that tool span needs to
   * reach its agent span once the rest of the path comes. No other link is worth keeping for it.
   */
  waitingLinks: string[];
  /**
   * Payloads of tool spans kept under a larger maxPayloadBytes (they waited in Redis through a restart that
   * lowered it) and left out now, as a fresh span's are (for metrics: reasons only).
   */
  notes: PayloadNote[];
}

const byStart = (a: KeptSpan, b: KeptSpan) => {
  const d = BigInt(a.startNs) - BigInt(b.startNs);
  if (d !== 0n) return d < 0n ? -1 : 1;
  const e = BigInt(a.endNs) - BigInt(b.endNs);
  if (e !== 0n) return e < 0n ? -1 : 1;
  return a.spanId < b.spanId ? -1 : a.spanId > b.spanId ? 1 : 0;
};

const nsToMs = (ns: string) => Number(BigInt(ns) / 1_000_000n);

export const eventIdOf = (traceId: string, spanId: string) => `otel-${traceId}-${spanId}`;
export const taskIdOf = (traceId: string, agentSpanId: string) => `otel-${traceId}-${agentSpanId}`;

/**
 * Maps the spans known for ONE trace to Paver events. A task is one invoke_agent span: its tool calls are
 * the execute_tool spans whose nearest invoke_agent ancestor it is, numbered by start time (step 0, 1, …),
 * and it ends with task_completed when the agent span itself is known (it is exported once it has ended).
 * `done` holds agent spans completed earlier: their tool spans are late and produce nothing.
 * Deterministic: the same spans give the same events with the same event ids.
 */
export function resolveTrace(
  spans: readonly KeptSpan[],
  done: ReadonlySet<string>,
  opts: MapOptions,
): ResolveResult {
  const index = new Map<string, KeptSpan>();
  for (const s of spans) {
    const prev = index.get(s.spanId);
    // A link-only copy never replaces a fuller record of the same span.
    if (!prev || prev.kind === 'link' || s.kind !== 'link') index.set(s.spanId, s);
  }
  const r: ResolveResult = {
    events: [],
    completedAgents: [],
    emittedTools: [],
    pendingTools: [],
    lateTools: [],
    orphanTools: [],
    nestedTools: [],
    emptyAgents: 0,
    spentLinks: [],
    waitingLinks: [],
    notes: [],
  };

  /**
   * What the chain of parents from `start` reaches: an agent span, or (not `throughTools`) the first tool span; null
   * at a root or in a cycle; 'missing' at an unknown span; 'late' at an agent span completed earlier (only its id is
   * kept, in `done`). Each span's answer is kept once found, so the walks of a trace are linear in its spans: walked
   * afresh for each span, a chain of 5,000 spans with 5,000 tool spans below it took 37,500,000 steps (16 to 43 s
   * on a busy 2-core machine), for one request.
   */
  type Above = KeptSpan | null | 'missing' | 'late';
  const above = (memo: Map<string, Above>, throughTools: boolean) => {
    return (start: string | null): Above => {
      const path: string[] = [];
      const walked = new Set<string>();
      let id = start;
      let found: Above;
      for (;;) {
        if (id === null) {
          found = null;
          break;
        }
        if (memo.has(id)) {
          found = memo.get(id)!;
          break;
        }
        if (walked.has(id)) {
          found = null;
          break;
        }
        const p = index.get(id);
        if (!p) {
          found = done.has(id) ? 'late' : 'missing';
          break;
        }
        if (p.kind === 'agent' || (p.kind === 'tool' && !throughTools)) {
          found = p;
          break;
        }
        path.push(id);
        walked.add(id);
        id = p.parentSpanId;
      }
      for (const q of path) memo.set(q, found);
      return found;
    };
  };
  const aboveAll = above(new Map(), true);
  const aboveLinks = above(new Map(), false);

  /**
   * Nearest agent ancestor; null when the chain reaches a root without one (or loops); 'missing' when a link is
   * unknown; 'late' when the chain reaches an agent span already completed. For a tool span, 'nested' when the chain
   * meets another tool span first.
   */
  const agentOf = (s: KeptSpan): KeptSpan | null | 'missing' | 'late' | 'nested' => {
    if (s.kind !== 'tool') return aboveAll(s.parentSpanId);
    const a = aboveLinks(s.parentSpanId);
    // One call the agent made can leave several execute_tool spans, one inside the other: the MCP client's
    // tools/call with the MCP server's below it (both execute_tool, same tool: the conventions' mcp.md), or a
    // framework's execute_tool around the MCP client's. Each was a step of its own, so one call read as the
    // same tool called two or three times in a row. The outermost is the agent's call; the ones inside it are
    // how that call ran. The span itself, met again, is a cycle.
    if (a !== null && typeof a === 'object' && a.kind === 'tool')
      return a.spanId === s.spanId ? null : 'nested';
    return a;
  };
  // Every agent span known here is completed by this call, if it was not before.
  for (const s of index.values()) {
    if (s.kind !== 'link') continue;
    const a = agentOf(s);
    if (a === 'late' || (a !== null && a !== 'missing' && a !== 'nested')) r.spentLinks.push(s.spanId);
  }

  const waiting = new Set<string>();
  // A waiting tool span's path is links only, up to the unknown span (agentOf said 'missing').
  const onPath = (s: KeptSpan) => {
    for (let p = s.parentSpanId && index.get(s.parentSpanId); p && !waiting.has(p.spanId);) {
      waiting.add(p.spanId);
      r.waitingLinks.push(p.spanId);
      p = p.parentSpanId && index.get(p.parentSpanId);
    }
  };
  const tasks = new Map<string, KeptSpan[]>();
  for (const s of index.values()) {
    if (s.kind !== 'tool') continue;
    const agent = agentOf(s);
    if (agent === 'missing') {
      r.pendingTools.push(s.spanId);
      onPath(s);
    } else if (agent === 'nested') r.nestedTools.push(s.spanId);
    else if (agent === 'late') r.lateTools.push(s.spanId);
    else if (agent === null) r.orphanTools.push(s.spanId);
    else if (done.has(agent.spanId)) r.lateTools.push(s.spanId);
    else {
      const list = tasks.get(agent.spanId) ?? [];
      list.push(s);
      tasks.set(agent.spanId, list);
    }
  }

  const agents = [...index.values()].filter((s) => s.kind === 'agent' && !done.has(s.spanId)).sort(byStart);
  for (const agent of agents) {
    r.completedAgents.push(agent.spanId);
    const tools = (tasks.get(agent.spanId) ?? []).sort(byStart);
    if (tools.length === 0) {
      r.emptyAgents++;
      continue;
    }
    // One session per task, so all of its events share a partition key and stay in order downstream. Read from
    // the task's own spans only, which are all here whenever it is published. A span enclosing the agent span
    // (a request's root span, the outer agent of an agent invoked as a tool) ends, and is exported, after it:
    // read from there too, the session and tenant depended on whether it came in the same message, so the same
    // event ids went out under another key and tenant (a redelivery cut elsewhere, paver otel against the
    // service, a long run against a short one).
    const session = agent.session ?? tools.find((t) => t.session)?.session ?? agent.traceId;
    const tenant = agent.tenant ?? tools.find((t) => t.tenant)?.tenant ?? opts.defaultTenant;
    const common = {
      tenant_id: tenant,
      agent_id: agent.agent ?? 'default',
      session_id: session,
      task_id: taskIdOf(agent.traceId, agent.spanId),
    };
    tools.forEach((t, step) => {
      const e: ToolCallEvent = {
        type: 'tool_call',
        event_id: eventIdOf(t.traceId, t.spanId),
        ts: nsToMs(t.startNs),
        ...common,
        step: Math.min(step, LIMITS.maxStep),
        tool: t.tool!,
        status: t.status,
      };
      // A tool span that waited in Redis was kept under the configuration of its time: payloads turned off since
      // (INGEST_INCLUDE_PAYLOADS=false, for what they may hold) must not go out with it after the restart.
      // So must a payload over the limit in force now, kept while INGEST_MAX_PAYLOAD_BYTES was larger: the limit is
      // the operator's bound on what leaves, whenever the span was read.
      if (opts.includePayloads) {
        if (t.args !== undefined) {
          if (keptPayloadBytes(t.args, t.argsBytes) <= opts.maxPayloadBytes) e.args = t.args;
          else r.notes.push({ field: 'args', reason: 'oversize' });
        }
        if (t.observation !== undefined) {
          if (keptPayloadBytes(t.observation, t.observationBytes) <= opts.maxPayloadBytes)
            e.observation = t.observation;
          else r.notes.push({ field: 'observation', reason: 'oversize' });
        }
      }
      r.events.push(e);
      r.emittedTools.push(t.spanId);
    });
    r.events.push({
      type: 'task_completed',
      event_id: `${eventIdOf(agent.traceId, agent.spanId)}-completed`,
      ts: nsToMs(agent.endNs),
      ...common,
      status: agent.status,
    });
  }
  return r;
}

/** Groups spans by trace id, in first-seen order. */
export function byTrace<T extends { traceId: string }>(spans: Iterable<T>): Map<string, T[]> {
  const out = new Map<string, T[]>();
  for (const s of spans) {
    const list = out.get(s.traceId);
    if (list) list.push(s);
    else out.set(s.traceId, [s]);
  }
  return out;
}

export interface OfflineResult {
  events: (ToolCallEvent | TaskCompletedEvent)[];
  stats: {
    spans: number;
    toolCalls: number;
    tasks: number;
    pending: number;
    orphans: number;
    /** Tool spans inside another tool span's call (not steps). */
    nested: number;
  };
  notes: PayloadNote[];
}

/**
 * Every span at once (a file): the events the service publishes once it has seen the same spans, in trace
 * order. Tool spans whose agent span is absent stay pending and produce nothing, as in the service.
 */
export function mapSpans(spans: Iterable<OtlpSpan>, opts: MapOptions): OfflineResult {
  const out: OfflineResult = {
    events: [],
    stats: { spans: 0, toolCalls: 0, tasks: 0, pending: 0, orphans: 0, nested: 0 },
    notes: [],
  };
  const kept: KeptSpan[] = [];
  for (const s of spans) {
    const k = keepSpan(s, opts);
    kept.push(k.kept);
    out.notes.push(...k.notes);
    out.stats.spans++;
  }
  const none = new Set<string>();
  for (const trace of byTrace(kept).values()) {
    const r = resolveTrace(trace, none, opts);
    for (const e of r.events) out.events.push(e); // a trace may hold more events than push(...) takes arguments
    for (const n of r.notes) out.notes.push(n);
    out.stats.toolCalls += r.emittedTools.length;
    out.stats.tasks += r.events.filter((e) => e.type === 'task_completed').length;
    out.stats.pending += r.pendingTools.length;
    out.stats.orphans += r.orphanTools.length;
    out.stats.nested += r.nestedTools.length;
  }
  return out;
}
