import type { Redis } from 'ioredis';
import { z } from 'zod';
import { execPipeline } from '../../../../../shared/redis/replies.js';
import { escapeKeyPart, scopeTag } from '../../../../../shared/redis/keys.js';
import { newLearnTask, newScopeState, type LearnTask, type ScopeState } from '../../core/learn/learner.js';
import { scopeId, taskId, type LearnStore } from '../../core/learn/engine.js';

/** `<prefix>:aseq:{tenant|agent}:learn`: the scope's learned state (contexts, slots, rules), one JSON value. */
export const learnKey = (prefix: string, tenant: string, agent: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:learn`;
/** `<prefix>:aseq:{tenant|agent}:ltask:<task_id>`: a task's recent calls, user text and pending proposals. */
export const learnTaskKey = (prefix: string, tenant: string, agent: string, task: string): string =>
  `${prefix}:aseq:${scopeTag(tenant, agent)}:ltask:${escapeKeyPart(task)}`;

// Shallow checks: the state is ours (written by this code); a mismatch (another version) starts afresh.
const scopeShape = z.object({
  v: z.literal(1),
  clock: z.number(),
  ctx: z.record(z.string(), z.unknown()),
  slots: z.record(z.string(), z.unknown()),
});
const taskShape = z.object({
  seen: z.array(z.string()),
  calls: z.array(z.object({ tool: z.string() }).passthrough()),
  user: z.string().nullable(),
  pending: z.array(z.unknown()),
  best: z.unknown(),
});

export interface BatchRef {
  tenant: string;
  agent: string;
  task?: string | undefined;
}

/**
 * A batch's learned state: loaded with one pipelined round trip, mutated in memory by the core, written
 * back with one MULTI (scope values and task values together, so a crash never leaves one without the
 * other). Task values expire after the task TTL; scope values are bounded by the core's limits instead.
 */
export class RedisLearnStore implements LearnStore {
  private readonly scopes = new Map<string, { tenant: string; agent: string; state: ScopeState }>();
  private readonly tasks = new Map<string, { ref: Required<BatchRef>; state: LearnTask }>();
  private readonly dirtyTasks = new Set<string>();

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly taskTtlMs: number,
  ) {}

  static async load(
    redis: Redis,
    prefix: string,
    taskTtlMs: number,
    refs: BatchRef[],
  ): Promise<RedisLearnStore> {
    const s = new RedisLearnStore(redis, prefix, taskTtlMs);
    const scopeRefs = new Map<string, BatchRef>();
    const taskRefs = new Map<string, Required<BatchRef>>();
    for (const r of refs) {
      scopeRefs.set(scopeId(r.tenant, r.agent), r);
      if (r.task !== undefined) taskRefs.set(taskId(r.tenant, r.agent, r.task), r as Required<BatchRef>);
    }
    const pipe = redis.pipeline();
    for (const r of scopeRefs.values()) pipe.get(learnKey(prefix, r.tenant, r.agent));
    for (const r of taskRefs.values()) pipe.get(learnTaskKey(prefix, r.tenant, r.agent, r.task));
    const replies = await execPipeline(pipe, 'learned state read');
    const value = (i: number): unknown => {
      const v = replies[i];
      return typeof v === 'string' ? (JSON.parse(v) as unknown) : null;
    };
    let i = 0;
    for (const [id, r] of scopeRefs) {
      const v = value(i++);
      s.scopes.set(id, {
        tenant: r.tenant,
        agent: r.agent,
        state: v !== null && scopeShape.safeParse(v).success ? (v as ScopeState) : newScopeState(),
      });
    }
    for (const [id, r] of taskRefs) {
      const v = value(i++);
      s.tasks.set(id, {
        ref: r,
        state: v !== null && taskShape.safeParse(v).success ? (v as LearnTask) : newLearnTask(),
      });
    }
    return s;
  }

  scope(tenant: string, agent: string): ScopeState {
    const id = scopeId(tenant, agent);
    let s = this.scopes.get(id);
    if (!s) this.scopes.set(id, (s = { tenant, agent, state: newScopeState() }));
    return s.state;
  }
  task(tenant: string, agent: string, task: string): LearnTask {
    return this.tasks.get(taskId(tenant, agent, task))?.state ?? newLearnTask();
  }
  setTask(tenant: string, agent: string, task: string, t: LearnTask): void {
    const id = taskId(tenant, agent, task);
    this.tasks.set(id, { ref: { tenant, agent, task }, state: t });
    this.dirtyTasks.add(id);
  }
  scopeStates(): { tenant: string; agent: string; state: ScopeState }[] {
    return [...this.scopes.values()];
  }

  /** `extra`: other per-task values (key, JSON) written with the same TTL in the same transaction. */
  async save(extra: [string, string][] = []): Promise<void> {
    const multi = this.redis.multi();
    for (const [k, v] of extra) multi.set(k, v, 'PX', this.taskTtlMs);
    for (const s of this.scopes.values())
      multi.set(learnKey(this.prefix, s.tenant, s.agent), JSON.stringify(s.state));
    for (const id of this.dirtyTasks) {
      const t = this.tasks.get(id)!;
      multi.set(
        learnTaskKey(this.prefix, t.ref.tenant, t.ref.agent, t.ref.task),
        JSON.stringify(t.state),
        'PX',
        this.taskTtlMs,
      );
    }
    await execPipeline(multi, 'learned state write');
  }
}

/** One scope's learned state for `GET /rules` (read-only). */
export async function readScope(
  redis: Redis,
  prefix: string,
  tenant: string,
  agent: string,
): Promise<ScopeState | null> {
  const v = await redis.get(learnKey(prefix, tenant, agent));
  if (v === null) return null;
  const parsed = JSON.parse(v) as unknown;
  return scopeShape.safeParse(parsed).success ? (parsed as ScopeState) : null;
}
