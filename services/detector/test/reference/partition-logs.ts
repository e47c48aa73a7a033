import { toolCallsEventV1, type ToolCallsEvent } from '../../../../schemas/index.js';

/** mulberry32: the stream and the schedule are derived from seeds fast-check chooses (and shrinks). */
export function rng(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ['exchange', 'keyboard', 'refund', 'cancel', 'flight', 'the', 'please', 'order', '4711', 'a_b'];

/**
 * Partition logs as Kafka would hold them: tasks (one session each) on random partitions, interleaved in
 * time, with idle gaps inside tasks, tasks that never complete, producer duplicates, user messages, and
 * an old run published late onto a partition whose clock is far ahead.
 */
export function makeLogs(
  seed: number,
  partitions: number,
  tasks: number,
  idleMs: number,
  /** The share of tasks that also call a tool no other task calls (a tool name carrying an id). */
  freshTools = 0,
): ToolCallsEvent[][] {
  const r = rng(seed);
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
  const tools = ['t_a', 't_b', 't_c', 't_d'];
  const motifs = [
    ['t_a', 't_b', 't_c'],
    ['t_b', 't_d', 't_a', 't_c'],
  ];
  const logs: ToolCallsEvent[][] = Array.from({ length: partitions }, () => []);
  const active: { id: string; agent: string; part: number; plan: string[]; step: number; done: boolean }[] =
    [];
  let next = 0;
  let ts = 1_000;
  const push = (part: number, e: Record<string, unknown>) => {
    const ev = toolCallsEventV1.parse(e);
    logs[part]!.push(ev);
    if (r() < 0.05) logs[part]!.push(ev); // a producer retry: the same event twice
  };
  while (next < tasks || active.length > 0) {
    while (active.length < 4 && next < tasks) {
      const plan = [...pick(motifs)];
      if (r() < 0.5) plan.push(pick(tools));
      if (r() < 0.3) plan.unshift(pick(tools));
      if (freshTools > 0 && r() < freshTools)
        plan.splice(Math.floor(r() * (plan.length + 1)), 0, `t_${next}`);
      const t = {
        id: `task-${next}`,
        agent: `agent${next % 2}`,
        part: Math.floor(r() * partitions),
        plan,
        step: 0,
        done: r() < 0.7,
      };
      next++;
      active.push(t);
      if (r() < 0.8) {
        ts += 1;
        const text = Array.from({ length: 4 }, () => pick(WORDS)).join(' ');
        push(t.part, { ts, ...base(t), type: 'user_message', event_id: `${t.id}-m`, text });
      }
    }
    const t = pick(active);
    // Mostly small steps; now and then a pause longer than the idle limit.
    ts += r() < 0.04 ? idleMs + Math.floor(r() * idleMs) : 1 + Math.floor(r() * 4);
    if (t.step < t.plan.length) {
      push(t.part, {
        ts,
        ...base(t),
        type: 'tool_call',
        event_id: `${t.id}-${t.step}`,
        step: t.step,
        tool: t.plan[t.step]!,
        ...(r() < 0.5 ? { cost_cents: pick([0.5, 1, 2]) } : {}),
      });
      t.step++;
    } else {
      if (t.done) push(t.part, { ts, ...base(t), type: 'task_completed', event_id: `${t.id}-done` });
      active.splice(active.indexOf(t), 1);
    }
  }
  // Old runs published after the fact: far behind their partition's clock.
  if (r() < 0.5) {
    const part = Math.floor(r() * partitions);
    const t = { id: 'old-0', agent: 'agent0', part };
    ['t_a', 't_b', 't_c'].forEach((tool, step) =>
      push(part, { ts: 10 + step, ...base(t), type: 'tool_call', event_id: `old-0-${step}`, step, tool }),
    );
    push(part, { ts: 20, ...base(t), type: 'task_completed', event_id: 'old-0-done' });
  }
  return logs;
}
const base = (t: { id: string; agent: string }) => ({
  tenant_id: 'acme',
  agent_id: t.agent,
  session_id: `s-${t.id}`,
  task_id: t.id,
});
