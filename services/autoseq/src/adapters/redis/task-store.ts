import type { Redis } from 'ioredis';
import { z } from 'zod';
import { escapeKeyPart, scopeTag } from '../../../../../shared/redis/keys.js';
import { execPipeline } from '../../../../../shared/redis/replies.js';
import { newTaskState, type TaskState } from '../../core/decide.js';

export interface TaskRef {
  tenant: string;
  agent: string;
  task: string;
}

/** `<prefix>:aseq:{tenant|agent}:task:<task_id>`: the scope's hash tag keeps Redis Cluster happy. */
export const taskKey = (prefix: string, r: TaskRef): string =>
  `${prefix}:aseq:${scopeTag(r.tenant, r.agent)}:task:${escapeKeyPart(r.task)}`;

const stored = z.object({
  seen: z.array(z.string()),
  pending: z.string().nullable(),
  consecutive: z.number().int().nonnegative(),
  last: z.object({ tool: z.string(), fp: z.string() }).nullable(),
  // Absent in state written before positions were kept: the task's position is then unknown.
  at: z.object({ partition: z.number().int().nonnegative(), offset: z.string().regex(/^\d+$/) }).optional(),
  // Absent in state written before it was kept: a decision after a later user message then does not execute.
  prev: z
    .object({ tool: z.string(), held: z.literal(true).optional(), visible: z.array(z.string()).optional() })
    .optional(),
});

/**
 * Per-task auto-seq state: one pipelined read and one pipelined write per batch (GETs, not MGET, so keys of
 * different slots work on a cluster). Each key expires after AUTOSEQ_TASK_TTL_MS without events.
 */
export class RedisTaskStore {
  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly ttlMs: number,
  ) {}

  async load(refs: Map<string, TaskRef>): Promise<Map<string, TaskState>> {
    const ids = [...refs.keys()];
    const out = new Map<string, TaskState>();
    if (ids.length === 0) return out;
    const pipe = this.redis.pipeline();
    for (const id of ids) pipe.get(taskKey(this.prefix, refs.get(id)!));
    const values = await execPipeline(pipe, 'task state read');
    ids.forEach((id, i) => {
      const value = values[i];
      if (typeof value !== 'string') return out.set(id, newTaskState());
      // State written by another version, or not JSON at all: start the task afresh rather than stop the
      // consumer (a JSON.parse that threw failed the batch on every retry).
      let json: unknown;
      try {
        json = JSON.parse(value);
      } catch {
        return out.set(id, newTaskState());
      }
      const parsed = stored.safeParse(json);
      out.set(id, parsed.success ? parsed.data : newTaskState());
    });
    return out;
  }

  async save(states: Map<string, { ref: TaskRef; state: TaskState }>): Promise<void> {
    if (states.size === 0) return;
    const pipe = this.redis.pipeline();
    for (const { ref, state } of states.values())
      pipe.set(taskKey(this.prefix, ref), JSON.stringify(state), 'PX', this.ttlMs);
    await execPipeline(pipe, 'task state write');
  }
}
