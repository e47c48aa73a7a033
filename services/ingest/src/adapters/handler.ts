import { Counter, Gauge, type Registry } from 'prom-client';
import { PaverError } from '../../../../shared/errors.js';
import type { Logger } from '../../../../shared/log.js';
import type { EpochMarker } from '../../../../shared/redis/epoch.js';
import type { BatchHandler, Parser } from '../../../../shared/kafka/runner.js';
import type { Sink } from '../../../../shared/kafka/sink.js';
import type { TaskCompletedEvent, ToolCallEvent } from '../../../../schemas/index.js';
import { WIRE_HEADER_BYTES } from '../../../../shared/codec.js';
import { recordBatchBytes } from '../../../../shared/kafka/requests.js';
import {
  byTrace,
  keepSpan,
  resolveTrace,
  type KeptSpan,
  type MapOptions,
  type PayloadNote,
} from '../core/map.js';
import type { DecodeLimits, OtlpSpan } from '../core/otlp.js';
import { admitWaiting, brokenPaths } from '../core/room.js';
import { decodeOtlp, type OtlpEncoding } from './otlp-decode.js';
import type { PendingRecovery } from './recovery.js';
import { keptBytes, type RedisTraceStore, type TraceChange } from './trace-store.js';

export interface OtlpMessage {
  spans: OtlpSpan[];
  /** Spans of the request left out as malformed (bad ids, times): counted `invalid` once the chunk is handled. */
  invalid?: number;
}

const MAX_LOSS_RETRIES = 5;

/** Default of INGEST_MAX_PENDING_SPANS: spans of one trace waiting in Redis for its agent span. */
export const DEFAULT_MAX_PENDING_SPANS = 10_000;

/**
 * Default of INGEST_MAX_PENDING_BYTES: bytes of the spans of one trace waiting in Redis. Each chunk with a span of
 * the trace reads them all back, so this bounds that read and the memory it takes, which the count alone does not
 * (10,000 spans of two 64 KiB payloads each are about 1.25 GiB). 32 MiB holds the 10,000 spans at about 3 KiB each,
 * or 256 at the largest payloads INGEST_MAX_PAYLOAD_BYTES lets through by default.
 */
export const DEFAULT_MAX_PENDING_BYTES = 32 * 1024 * 1024;

/** Ingest metrics: counts and reasons only, never attribute values. */
export function createIngestMetrics(registry: Registry) {
  const registers = [registry];
  return {
    messages: new Counter({
      name: 'paver_ingest_messages_total',
      help: 'OTLP messages read, by detected encoding and outcome (decoded, or the dead-letter reason).',
      labelNames: ['encoding', 'outcome'],
      registers,
    }),
    spans: new Counter({
      name: 'paver_ingest_spans_total',
      help: 'Spans read, by outcome when read: tool_call (published with its task now), pending (waiting for the agent span; published later without being counted here again: see paver_ingest_events_total), dropped (no room left in its trace, for it or for a span on its path to its agent span: INGEST_MAX_PENDING_SPANS spans or INGEST_MAX_PENDING_BYTES bytes waiting), late (agent already completed), orphan (no invoke_agent ancestor), nested (inside the call of another tool span, as an MCP server span below the MCP client span), agent (an invoke_agent span: its task completed), other (not a GenAI tool or agent span), invalid (malformed: ids not 16 and 8 bytes of hex, times not integers; left out, the rest of its request kept). A span read twice (a redelivery) is counted each time: a copy of one published now is late. The outcomes add up to the spans read.',
      labelNames: ['outcome'],
      registers,
    }),
    events: new Counter({
      name: 'paver_ingest_events_total',
      help: 'Events published on the tool-calls topic, by type.',
      labelNames: ['type'],
      registers,
    }),
    payloadsOmitted: new Counter({
      name: 'paver_ingest_payloads_omitted_total',
      help: 'Tool arguments or results left out of an event, by field and reason (oversize, not_object, not_json, too_deep).',
      labelNames: ['field', 'reason'],
      registers,
    }),
    corruptState: new Counter({
      name: 'paver_ingest_corrupt_state_total',
      help: 'Buffered span records in Redis that failed validation and were ignored.',
      registers,
    }),
    rebuilds: new Counter({
      name: 'paver_ingest_rebuilds_total',
      help: "Rebuilds of a partition's pending spans from Kafka (Redis lost its state, or the partition was never built under the current epoch), by outcome: rebuilt, retried (lost again meanwhile), stopped (the consumer stopped or lost the partition: its next owner rebuilds it), failed.",
      labelNames: ['outcome'],
      registers,
    }),
    rebuilding: new Gauge({
      name: 'paver_ingest_rebuilding',
      help: 'Partitions whose pending spans are being rebuilt from Kafka right now.',
      registers,
    }),
    rebuildMessages: new Counter({
      name: 'paver_ingest_rebuild_messages_total',
      help: 'OTLP messages replayed from Kafka by rebuilds.',
      registers,
    }),
  };
}
export type IngestMetrics = ReturnType<typeof createIngestMetrics>;

export function otlpParser(
  encoding: OtlpEncoding,
  limits: DecodeLimits,
  /** None for a replay: its messages were counted when first read. */
  m?: IngestMetrics,
): Parser<OtlpMessage> {
  return (value) => {
    if (!(value instanceof Uint8Array))
      return { ok: false, reason: 'undecodable', detail: 'expected the raw message bytes' };
    const r = decodeOtlp(value, encoding, limits);
    m?.messages.inc({ encoding: r.encoding, outcome: r.ok ? 'decoded' : r.reason });
    return r.ok ? { ok: true, value: { spans: r.spans, invalid: r.invalid } } : r;
  };
}

/**
 * Done marks past the bound (INGEST_MAX_PENDING_SPANS, as for waiting spans), the oldest first. Every change
 * refreshes a trace's TTL, so a trace that never goes quiet (a conversation, a worker loop) kept a mark per task
 * for good, and every chunk of it read them all back. A mark that leaves only matters to a tool span of that
 * task arriving later still, or to its redelivery: the span waits (then expires) instead of counting as
 * `late`, and a redelivered agent span publishes its task again with the same event ids, which consumers
 * already skip.
 */
function oldestDone(doneAt: ReadonlyMap<string, number>, added: readonly string[], max: number): string[] {
  const kept = new Set(added);
  let over = doneAt.size - max;
  for (const a of kept) if (!doneAt.has(a)) over++;
  if (over <= 0) return [];
  return [...doneAt]
    .filter(([a]) => !kept.has(a))
    .sort((x, y) => x[1] - y[1] || (x[0] < y[0] ? -1 : 1))
    .slice(0, over)
    .map(([a]) => a);
}

/**
 * A tool_call over the output limit, made to fit: without its result, else without its arguments, else without
 * both (ids, tool and step are bounded, so that always fits). Each value was under INGEST_MAX_PAYLOAD_BYTES, but
 * the two together need not be under PAVER_MAX_OUTPUT_BYTES (a value may be up to 16 MiB, and a text result
 * counted in UTF-8 grows up to six times as JSON): the sink then left the whole tool_call out, and its task was
 * published with a step missing, as if the agent had never made that call. The same configuration gives the same
 * events on a redelivery.
 */
export function fitPayloads(
  maxBytes: number,
  omitted: (field: 'args' | 'observation') => void,
): (value: unknown) => unknown {
  return (value) => {
    const e = value as ToolCallEvent | TaskCompletedEvent;
    if (e.type !== 'tool_call' || (e.observation === undefined && e.args === undefined)) return null;
    // As the sink counts it (the broker's count: framing and key too): a record fitted to key and value alone
    // came out within about 80 bytes over, and the sink left it out after all.
    const fits = (v: ToolCallEvent) =>
      recordBatchBytes(
        Buffer.byteLength(e.session_id),
        Buffer.byteLength(JSON.stringify(v)) + WIRE_HEADER_BYTES,
      ) <= maxBytes;
    const { observation, args, ...bare } = e;
    const withArgs: ToolCallEvent = args === undefined ? bare : { ...bare, args };
    const withObservation: ToolCallEvent = observation === undefined ? bare : { ...bare, observation };
    const [out, left] =
      observation !== undefined && fits(withArgs)
        ? [withArgs, ['observation'] as const]
        : args !== undefined && fits(withObservation)
          ? [withObservation, ['args'] as const]
          : [bare, ['observation', 'args'] as const];
    for (const field of left) if (e[field] !== undefined) omitted(field);
    return out;
  };
}

/** What `apply` is asked to do with a chunk's spans. */
export interface ApplyMode {
  /** False while a replay rebuilds the state a Redis loss took: those tasks were published when first read. */
  publish: boolean;
  /** The epoch marker as last seen: the chunk's reads are checked against it (`lost`). */
  marker?: EpochMarker;
}

/**
 * One chunk of OTLP messages → tool-calls events. Spans of a trace are merged with what Redis holds for that
 * trace; tasks whose agent span is known are published (then remembered as done), the rest waits in Redis.
 * Publish first, then store: a crash in between republishes the same events with the same event ids.
 * `lost`: the marker said Redis lost its state before the reads; nothing was published or written.
 */
export function createIngestApply(deps: {
  store: RedisTraceStore;
  sink: Sink;
  topic: string;
  opts: MapOptions;
  metrics: IngestMetrics;
  /** Spans a trace may keep waiting in Redis for its agent span (INGEST_MAX_PENDING_SPANS); more are dropped. */
  maxPendingSpans?: number;
  /** Bytes of the spans a trace may keep waiting in Redis (INGEST_MAX_PENDING_BYTES); a span that does not fit is dropped. */
  maxPendingBytes?: number;
  /** PAVER_MAX_OUTPUT_BYTES, the sink's bound: a tool_call over it loses its payloads (`fitPayloads`). */
  maxOutputBytes?: number;
}): (messages: OtlpSpan[][], mode: ApplyMode) => Promise<{ lost: boolean }> {
  const { store, sink, topic, opts, metrics: m } = deps;
  const maxPending = deps.maxPendingSpans ?? DEFAULT_MAX_PENDING_SPANS;
  const maxPendingBytes = deps.maxPendingBytes ?? DEFAULT_MAX_PENDING_BYTES;
  const fit = fitPayloads(deps.maxOutputBytes ?? Infinity, (field) =>
    m.payloadsOmitted.inc({ field, reason: 'oversize' }),
  );
  return async (messages, mode) => {
    // A replay counts nothing: these spans were counted when first read.
    const count = mode.publish;
    const fresh: KeptSpan[] = [];
    // Payloads left out, counted with the outcomes once the chunk is handled: a chunk that fails (its send, Redis
    // lost under it) is read again and counted then.
    const omitted: PayloadNote[] = [];
    // The messages each span came in, by trace: a redelivery brings a message back whole, never a part of it.
    const messagesOf = new Map<string, Map<string, Set<number>>>();
    messages.forEach((spans, i) => {
      for (const span of spans) {
        const { kept, notes } = keepSpan(span, opts);
        fresh.push(kept);
        for (const n of notes) omitted.push(n);
        const trace = messagesOf.get(kept.traceId) ?? new Map<string, Set<number>>();
        messagesOf.set(kept.traceId, trace);
        trace.set(kept.spanId, (trace.get(kept.spanId) ?? new Set()).add(i));
      }
    });
    const all = [...byTrace(fresh)];
    if (all.length === 0) return { lost: false };
    // Every trace's state is read, those with only links in this chunk too (one pipelined read either way): a
    // tool span waiting in Redis may need exactly these links to reach its agent span, which comes later.
    const { states, corrupt, lost } = await store.load(
      all.map(([t]) => t),
      mode.marker,
    );
    if (lost) return { lost };
    if (corrupt) m.corruptState.inc(corrupt);
    const traces = all.filter(
      ([t, spans]) =>
        spans.some((s) => s.kind !== 'link') ||
        (states.get(t)?.spans.some((s) => s.kind === 'tool') ?? false),
    );
    const relevant = new Set(traces.map(([t]) => t));
    const others = fresh.filter((s) => !relevant.has(s.traceId) || s.kind === 'link').length;
    if (traces.length === 0) {
      if (count && others) m.spans.inc({ outcome: 'other' }, others);
      if (count) for (const n of omitted) m.payloadsOmitted.inc(n);
      return { lost: false };
    }

    const events = [];
    const changes = new Map<string, TraceChange>();
    const outcomes = {
      tool_call: 0,
      pending: 0,
      late: 0,
      orphan: 0,
      nested: 0,
      dropped: 0,
      agent: 0,
      // Counted with the rest, after the chunk's events are sent and its changes saved: a chunk that fails is
      // read again, and counted then.
      other: others,
    };
    for (const [traceId, spans] of traces) {
      const state = states.get(traceId) ?? {
        spans: [],
        done: new Set<string>(),
        doneAt: new Map<string, number>(),
        bytes: new Map<string, number>(),
      };
      const res = resolveTrace([...state.spans, ...spans], state.done, opts);
      events.push(...res.events);
      for (const n of res.notes) omitted.push(n);
      const freshIds = new Set(spans.map((s) => s.spanId));
      const buffered = new Set(state.spans.map((s) => s.spanId));
      const pending = new Set(res.pendingTools);
      // A link whose agent span is completed leaves the hash, its id kept as done (a tool span below it is late):
      // left there, links of task after task filled a long trace's room, and its later tool spans were dropped.
      const settled = [
        ...res.emittedTools,
        ...res.lateTools,
        ...res.orphanTools,
        ...res.nestedTools,
        ...res.spentLinks,
      ];
      // Links are kept only while a waiting tool span needs them on its path to its agent span. A trace that never
      // goes quiet (a worker loop, with spans outside its agents' tasks below a root span not exported yet) would
      // otherwise keep every link read while some tool span of it waited, for good (each change refreshes the
      // TTL), until they filled its room and its tool spans were dropped.
      const onPath = new Set(res.waitingLinks);
      const unneeded = new Set(settled);
      for (const b of state.spans) if (b.kind === 'link' && !onPath.has(b.spanId)) unneeded.add(b.spanId);
      const drop = [...unneeded].filter((id) => buffered.has(id));
      // Each span once, and none already waiting: a redelivered message (or one read twice in a chunk) would take
      // room again, and near the bound leave a new span of the trace out, its task then published without that
      // tool call.
      const waiting = [
        ...new Map(
          spans
            .filter((s) => !buffered.has(s.spanId) && (pending.has(s.spanId) || onPath.has(s.spanId)))
            .map((s) => [s.spanId, s]),
        ).values(),
      ];
      // A spent link read now is marked done when the trace is written anyway: a tool span waits, or an agent span
      // completes now (its mark is written). The latter is the link that came with its agent span, in the same
      // message (the agent's process exports both) while the tool span below it comes later (run by another
      // process): unmarked, that tool span found neither and waited, then expired, instead of counting as late.
      // Of those, only a link that a span read later may need is marked: one with no child read yet (a call whose
      // other side, run elsewhere, exports later), or with a child that came in a message without it (a redelivery
      // of that message brings the child alone). A link whose children all came in its own message is not: a
      // redelivery of that message brings it again. Marking those too wrote, for the usual task exported whole, one
      // mark per span between its agent span and its tool spans, each kept INGEST_PENDING_TTL_MS among the trace's
      // bounded marks, where they pushed out agents' marks. The cost: a tool span exported later (by another
      // process) below a link that already had a child in its message waits and expires instead of being late.
      const inMessages = messagesOf.get(traceId);
      const childrenOf = new Map<string, KeptSpan[]>();
      for (const c of [...state.spans, ...spans]) {
        if (c.parentSpanId === null) continue;
        const list = childrenOf.get(c.parentSpanId);
        if (list) list.push(c);
        else childrenOf.set(c.parentSpanId, [c]);
      }
      const cameWithout = (child: KeptSpan, own: ReadonlySet<number>) =>
        buffered.has(child.spanId) || [...(inMessages?.get(child.spanId) ?? [])].some((m) => !own.has(m));
      const laterChildPossible = (id: string) => {
        const children = childrenOf.get(id) ?? [];
        const own = inMessages?.get(id) ?? new Set<number>();
        return children.length === 0 || children.some((c) => cameWithout(c, own));
      };
      const spentKept = res.spentLinks.filter(
        (id) =>
          buffered.has(id) ||
          (freshIds.has(id) &&
            (pending.size > 0 || res.completedAgents.length > 0) &&
            laterChildPossible(id)),
      );
      // Bounded per trace: an agent span that never ends (a loop that runs for days, a crashed agent) would
      // otherwise grow its hash for good, and every chunk of the trace reads the whole hash back.
      // And by bytes: the count alone let a trace hold 10,000 spans of two 64 KiB payloads each, all read back by
      // every chunk of it. A span whose path to its agent span is not stored whole (a link above it found no room)
      // is dropped too: it could never be published.
      const dropped = new Set(drop);
      const stored = new Set(state.spans.filter((s) => !dropped.has(s.spanId)).map((s) => s.spanId));
      let bytes = 0;
      for (const s of state.spans)
        if (!dropped.has(s.spanId)) bytes += state.bytes.get(s.spanId) ?? keptBytes(s);
      const admitted = new Set(
        admitWaiting({
          candidates: waiting.map((s) => ({
            spanId: s.spanId,
            parentSpanId: s.parentSpanId,
            bytes: keptBytes(s),
          })),
          stored,
          pathLinks: onPath,
          room: Math.max(0, maxPending - stored.size),
          usedBytes: bytes,
          maxBytes: maxPendingBytes,
        }).map((c) => c.spanId),
      );
      const put = waiting.filter((s) => admitted.has(s.spanId));
      // So for a tool span already waiting: a link of its path read now that found no room is one it can never
      // reach its agent span through (a span is exported once). It leaves the hash now (counted when it was read)
      // instead of holding its room until it expires, waiting for what cannot come.
      const through = new Set([...stored, ...admitted]);
      const parentOf = new Map([...state.spans, ...spans].map((s) => [s.spanId, s.parentSpanId]));
      const broken = brokenPaths(onPath, through, parentOf);
      const cut = new Set(
        [...pending].filter((id) => buffered.has(id) && !dropped.has(id) && broken(parentOf.get(id) ?? null)),
      );
      drop.push(...cut);
      const kept = new Set([...buffered, ...put.map((s) => s.spanId)].filter((id) => !cut.has(id)));
      // At most maxPending marks, agents' first: a message may bring an agent span with more spans below it than
      // that (each a spent link), and oldestDone only makes room among the marks already written. An agent's mark is
      // what a redelivery of its task is judged by; a link's only serves a tool span exported later below it.
      const done = [...res.completedAgents, ...spentKept].slice(0, maxPending);
      changes.set(traceId, { put, drop, done, undone: oldestDone(state.doneAt, done, maxPending) });
      // One outcome per span read, when read: the outcomes add up to the spans read. A tool span that waited was
      // counted as pending then, not again when its task is published (events_total counts what is published); each
      // copy of a span read twice in the chunk (a message redelivered with the next) has one, and a copy of a span
      // published now is late, as it would be in a later chunk.
      const outcomeOf = new Map<string, keyof typeof outcomes>();
      for (const id of res.emittedTools) outcomeOf.set(id, 'tool_call');
      for (const id of res.pendingTools) outcomeOf.set(id, kept.has(id) ? 'pending' : 'dropped');
      for (const id of res.lateTools) outcomeOf.set(id, 'late');
      for (const id of res.orphanTools) outcomeOf.set(id, 'orphan');
      for (const id of res.nestedTools) outcomeOf.set(id, 'nested');
      const counted = new Set<string>();
      for (const s of spans) {
        if (s.kind === 'agent') outcomes.agent++;
        else if (s.kind === 'tool') {
          const o = outcomeOf.get(s.spanId) ?? 'other';
          outcomes[o === 'tool_call' && counted.has(s.spanId) ? 'late' : o]++;
          counted.add(s.spanId);
        }
      }
    }
    if (mode.publish)
      await sink.send(
        topic,
        'tool-calls.v1',
        events.map((e) => ({ key: e.session_id, value: e })),
        fit,
      );
    await store.save(changes);
    if (count) {
      for (const [outcome, n] of Object.entries(outcomes)) if (n) m.spans.inc({ outcome }, n);
      for (const n of omitted) m.payloadsOmitted.inc(n);
      for (const e of events) m.events.inc({ type: e.type });
    }
    return { lost: false };
  };
}

/**
 * The service's chunk handler. With `recovery`, each chunk first makes sure its partition's pending spans are
 * in Redis (rebuilt from Kafka after a loss), and a loss met by the chunk's own reads rebuilds and reads again.
 */
export function createIngestHandler(
  deps: Parameters<typeof createIngestApply>[0] & { recovery?: PendingRecovery; log?: Logger },
): BatchHandler<OtlpMessage> {
  const apply = createIngestApply(deps);
  const { recovery } = deps;
  return async (records, ctx) => {
    const first = records[0];
    if (!first) return;
    const messages = records.map((r) => r.value.spans);
    // Counted as the chunk's other outcomes are, once it is handled: a chunk that fails is counted when read again.
    const invalid = records.reduce((n, r) => n + (r.value.invalid ?? 0), 0);
    const handled = () => {
      if (invalid) deps.metrics.spans.inc({ outcome: 'invalid' }, invalid);
    };
    if (!recovery) {
      await apply(messages, { publish: true });
      handled();
      return;
    }
    for (let attempt = 1; ; attempt++) {
      // Everything before this chunk on its partition has been handled: that is where a rebuild's replay ends.
      const marker = await recovery.ensure(
        first.partition,
        BigInt(first.offset),
        ctx,
        Number(first.timestamp),
      );
      if (!(await apply(messages, { publish: true, marker })).lost) {
        handled();
        return;
      }
      if (attempt >= MAX_LOSS_RETRIES)
        throw new PaverError('REDIS_UNAVAILABLE', 'ingest state lost in Redis again after every rebuild');
      deps.log?.warn(
        { partition: first.partition },
        'ingest state lost in Redis during a chunk: rebuilding before handling it',
      );
      recovery.invalidate(first.partition);
    }
  };
}
