import type { Redis } from 'ioredis';
import { z } from 'zod';
import type { KeptSpan } from '../core/map.js';
import type { EpochMarker } from '../../../../shared/redis/epoch.js';
import { execPipeline, redisFailure } from '../../../../shared/redis/replies.js';

const keptSpan: z.ZodType<KeptSpan> = z.object({
  traceId: z.string(),
  spanId: z.string(),
  parentSpanId: z.string().nullable(),
  kind: z.enum(['tool', 'agent', 'link']),
  startNs: z.string().regex(/^\d+$/),
  endNs: z.string().regex(/^\d+$/),
  status: z.enum(['ok', 'error']),
  tool: z.string().optional(),
  callId: z.string().optional(),
  // Checked, not rebuilt: zod's record copies the keys by assignment, which drops one named `__proto__` (an
  // argument the model wrote), so a tool span that waited here would go out with fewer arguments than one that
  // came with its agent span.
  args: z
    .custom<Record<string, unknown>>((v) => v !== null && typeof v === 'object' && !Array.isArray(v))
    .optional(),
  observation: z.unknown().optional(),
  argsBytes: z.number().int().nonnegative().optional(),
  observationBytes: z.number().int().nonnegative().optional(),
  agent: z.string().optional(),
  session: z.string().optional(),
  tenant: z.string().optional(),
});

export interface TraceState {
  spans: KeptSpan[];
  /** Agent span ids whose task was already published. */
  done: Set<string>;
  /** When each was marked (epoch ms; 0 for marks of older versions, which carry none). */
  doneAt: Map<string, number>;
  /** UTF-8 bytes each waiting span takes in the hash (its stored record): what INGEST_MAX_PENDING_BYTES bounds. */
  bytes: Map<string, number>;
}

export interface TraceChange {
  put: KeptSpan[];
  drop: string[];
  done: string[];
  /** Done marks that leave (the oldest, past the trace's bound). */
  undone?: string[];
}

/** UTF-8 bytes of a span's record in its trace's hash, as `save` writes it. */
export const keptBytes = (s: KeptSpan): number => Buffer.byteLength(JSON.stringify(s));

/** Keys outside any trace: the epoch marker, and per input topic partition the epoch its state was last rebuilt in. */
export const ingestGlobalKeys = (prefix: string) => ({
  epoch: `${prefix}:ingest:epoch`,
  rebuilt: `${prefix}:ingest:rebuilt`,
});

/**
 * Per-trace state between Kafka messages, one Redis hash per trace: `s:<spanId>` holds a span waiting for
 * its agent span (or a span on its path there), `d:<spanId>` marks a task already published (or a span on a
 * published task's path), its value when (epoch ms). The whole hash expires `ttlMs` after its
 * last change, which bounds what a trace whose agent span never arrives can hold; the handler bounds the
 * marks of a trace that never goes quiet.
 */
export class RedisTraceStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly ttlMs: number,
  ) {}

  private key(traceId: string) {
    return `${this.prefix}:ingest:trace:${traceId}`;
  }

  /**
   * The traces' states. With `marker`, the epoch marker is read after them in the same pipeline: when it is no
   * longer the value the service last saw, Redis lost its state before (or while) they were read, and `lost`
   * says so; the states are then not to be used (a task would be published without its tool calls).
   */
  async load(
    traceIds: string[],
    marker?: EpochMarker,
  ): Promise<{ states: Map<string, TraceState>; corrupt: number; lost: boolean }> {
    const states = new Map<string, TraceState>();
    let corrupt = 0;
    if (traceIds.length === 0) return { states, corrupt, lost: false };
    const p = this.redis.pipeline();
    for (const t of traceIds) p.hgetall(this.key(t));
    if (marker) p.get(marker.key);
    const replies = await execPipeline(p, 'pending spans read');
    if (marker && replies[traceIds.length] !== marker.value) return { states, corrupt, lost: true };
    traceIds.forEach((t, i) => {
      const hash = replies[i];
      const state: TraceState = { spans: [], done: new Set(), doneAt: new Map(), bytes: new Map() };
      for (const [field, value] of Object.entries((hash ?? {}) as Record<string, string>)) {
        if (field.startsWith('d:')) {
          const id = field.slice(2);
          state.done.add(id);
          const at = Number(value);
          state.doneAt.set(id, Number.isSafeInteger(at) && at > 1 ? at : 0);
        } else if (field.startsWith('s:')) {
          let parsed: unknown;
          try {
            parsed = JSON.parse(value);
          } catch {
            parsed = undefined;
          }
          const r = keptSpan.safeParse(parsed);
          if (r.success) {
            state.spans.push(r.data);
            state.bytes.set(r.data.spanId, Buffer.byteLength(value));
          } else corrupt++;
        }
      }
      states.set(t, state);
    });
    return { states, corrupt, lost: false };
  }

  async save(changes: Map<string, TraceChange>): Promise<void> {
    const p = this.redis.pipeline();
    const now = String(Date.now());
    let n = 0;
    for (const [traceId, c] of changes) {
      const undone = c.undone ?? [];
      if (c.put.length + c.drop.length + c.done.length + undone.length === 0) continue;
      const key = this.key(traceId);
      if (c.drop.length + undone.length)
        p.hdel(key, ...c.drop.map((s) => `s:${s}`), ...undone.map((a) => `d:${a}`));
      const fields: string[] = [];
      for (const s of c.put) fields.push(`s:${s.spanId}`, JSON.stringify(s)); // keptBytes measures this
      for (const a of c.done) fields.push(`d:${a}`, now);
      if (fields.length) p.hset(key, ...fields);
      p.pexpire(key, this.ttlMs);
      n++;
    }
    if (n === 0) return;
    await execPipeline(p, 'pending spans write');
  }

  /**
   * The epoch in which the pending spans of `topic`'s `partition` were last rebuilt (or found complete), if any.
   * By topic too: deployments on other OTLP topics may share the prefix (and the epoch), with partitions of the
   * same numbers; a mark by number alone let one deployment's rebuild stand for another's.
   */
  async rebuiltIn(topic: string, partition: number): Promise<string | null> {
    try {
      return await this.redis.hget(ingestGlobalKeys(this.prefix).rebuilt, `${topic}:${partition}`);
    } catch (err) {
      throw redisFailure('ingest rebuild mark read', err);
    }
  }

  async markRebuilt(topic: string, partition: number, epoch: string): Promise<void> {
    try {
      await this.redis.hset(ingestGlobalKeys(this.prefix).rebuilt, `${topic}:${partition}`, epoch);
    } catch (err) {
      throw redisFailure('ingest rebuild mark write', err);
    }
  }
}
