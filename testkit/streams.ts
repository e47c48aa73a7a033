// Synthetic agent traffic for the tests and the benchmarks (neither depends on the other).
/**
 * Synthetic agent traffic: sessions run tasks whose tool sequences mix a few recurring workflows with noise,
 * the shape real agent logs have (a handful of paths walked again and again). Deterministic per seed.
 */
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

const TOOLS = [
  'file_read',
  'validate_yaml',
  'file_write',
  'bash_execute',
  'web_search',
  'summarize',
  'think',
  'http_get',
  'parse_json',
  'sql_query',
  'send_email',
  'git_diff',
  'run_tests',
  'lint',
  'format_code',
];
const WORKFLOWS = [
  ['file_read', 'validate_yaml', 'file_write', 'bash_execute'],
  ['web_search', 'http_get', 'parse_json', 'summarize'],
  ['git_diff', 'lint', 'run_tests'],
  ['sql_query', 'parse_json', 'send_email'],
];

export function* agentEvents(opts: {
  tasks: number;
  seed?: number;
  concurrency?: number;
  agents?: number;
  startTs?: number;
}) {
  const r = rng(opts.seed ?? 42);
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
  const concurrency = opts.concurrency ?? 20;
  let ts = opts.startTs ?? 1_760_000_000_000;
  let next = 0;
  const active: { id: string; session: string; agent: string; plan: string[]; step: number }[] = [];
  while (next < opts.tasks || active.length > 0) {
    while (active.length < concurrency && next < opts.tasks) {
      const plan: string[] = [];
      if (r() < 0.3) plan.push(pick(TOOLS));
      plan.push(...pick(WORKFLOWS));
      if (r() < 0.5) plan.push(pick(TOOLS));
      if (r() < 0.2) plan.push(...pick(WORKFLOWS));
      const id = `task-${next}`;
      active.push({
        id,
        session: `session-${next % 997}`,
        agent: `agent-${next % (opts.agents ?? 1)}`,
        plan,
        step: 0,
      });
      next++;
    }
    const t = active[Math.floor(r() * active.length)]!;
    ts += 1 + Math.floor(r() * 5);
    const base = { ts, tenant_id: 'default', agent_id: t.agent, session_id: t.session, task_id: t.id };
    if (t.step < t.plan.length) {
      yield {
        ...base,
        type: 'tool_call',
        event_id: `${t.id}:${t.step}`,
        step: t.step,
        tool: t.plan[t.step]!,
        cost_cents: Math.round(r() * 400) / 100,
        args: { path: '/etc/app.yaml' },
        observation: { ok: true },
      };
      t.step++;
    } else {
      yield { ...base, type: 'task_completed', event_id: `${t.id}:done` };
      active.splice(active.indexOf(t), 1);
    }
  }
}
