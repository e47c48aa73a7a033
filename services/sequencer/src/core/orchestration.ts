import { RE2JS } from 're2js';
import {
  agentOrchestrationV1,
  orchestrationFileV1,
  type AgentOrchestration,
  type OrchestrationStep,
} from '../../../../schemas/index.js';

export class ConfigError extends Error {}

/** `*` matches any run of characters; everything else is literal (no regular expressions in tool patterns). */
export function globMatch(pattern: string, name: string): boolean {
  if (!pattern.includes('*')) return pattern === name;
  const parts = pattern.split('*');
  const first = parts[0]!;
  const last = parts[parts.length - 1]!;
  if (!name.startsWith(first) || name.length < first.length + last.length || !name.endsWith(last))
    return false;
  let at = first.length;
  const end = name.length - last.length;
  for (const mid of parts.slice(1, -1)) {
    if (!mid) continue;
    const i = name.indexOf(mid, at);
    if (i < 0 || i + mid.length > end) return false;
    at = i + mid.length;
  }
  return true;
}

export type Condition =
  | { type: 'message_regex'; test: (text: string) => boolean; source: string }
  | { type: 'tool_used'; tool: string }
  /** The most recent tools, position by position, are members of these groups (oldest first). */
  | { type: 'sequence_match'; groups: string[][] };

export interface Step {
  name: string;
  conditions: Condition[];
  hasMessageCondition: boolean;
  allowed: string[] | null;
  denied: string[];
  /** Each position is a group of alternatives (a single tool is a group of one). */
  sequence: string[][];
  isDefault: boolean;
}

export interface Agent {
  tools: string[];
  steps: Step[];
  byName: Map<string, Step>;
  defaultStep: Step | null;
  policy: 'warn' | 'reset' | 'hold';
  sticky: boolean;
  /** Tools remembered per session: enough for the longest sequence_match, at least HISTORY_MIN. */
  history: number;
}

export const HISTORY_MIN = 8;

/** The step's own filter: allowed patterns (when any), then denied patterns. Paver applies both. */
export const stepAllows = (step: Step, tool: string): boolean =>
  (step.allowed === null || step.allowed.some((p) => globMatch(p, tool))) &&
  !step.denied.some((p) => globMatch(p, tool));

const ownSequence = (s: OrchestrationStep): string[][] =>
  (s.sequence ?? []).map((g) => (typeof g === 'string' ? [g] : g));

function compileStep(s: OrchestrationStep): Step {
  const conditions: Condition[] = s.conditions.map((c) => {
    if (c.type === 'message_regex') {
      let re: RE2JS;
      try {
        // RE2: linear time in the message length, whatever the pattern; no user message can stall the consumer.
        re = RE2JS.compile(c.value, RE2JS.CASE_INSENSITIVE);
      } catch (err) {
        throw new ConfigError(
          `step '${s.name}': message_regex /${c.value}/ is not a valid RE2 expression: ${err instanceof Error ? err.message : String(err)}`,
        );
      }
      return { type: 'message_regex', test: (t: string) => re.test(t), source: c.value };
    }
    if (c.type === 'tool_used') return { type: 'tool_used', tool: c.value };
    // Without a value, AgentDock matches the history's tail against the step's own sequence (a group matches
    // any of its members); a step without a sequence then never matches, as in AgentDock.
    return { type: 'sequence_match', groups: c.value ? c.value.map((t) => [t]) : ownSequence(s) };
  });
  const allowed = s.availableTools.allowed?.length ? s.availableTools.allowed : null;
  const step: Step = {
    name: s.name,
    conditions,
    hasMessageCondition: conditions.some((c) => c.type === 'message_regex'),
    allowed,
    denied: s.availableTools.denied ?? [],
    sequence: ownSequence(s),
    isDefault: s.isDefault,
  };
  const refused = [...new Set(step.sequence.flat().filter((t) => !stepAllows(step, t)))];
  if (refused.length) {
    throw new ConfigError(
      `step '${s.name}': sequence tool(s) ${refused.map((t) => `'${t}'`).join(', ')} not allowed by the step's availableTools`,
    );
  }
  return step;
}

/** Checks and compiles one agent's orchestration; every problem is reported, and nothing is half-applied. */
export function compileAgent(a: AgentOrchestration): Agent {
  const errors: string[] = [];
  const steps: Step[] = [];
  for (const s of a.steps) {
    try {
      steps.push(compileStep(s));
    } catch (err) {
      errors.push(err instanceof Error ? err.message : String(err));
    }
  }
  // A sequence tool the agent does not declare is in no universe a record or a read filters (the declared tools):
  // its position is never available, the answer falls back to the step's filter, and the sequence is never
  // enforced. Sequences name tools exactly (wildcards are only in availableTools, checked above). Without declared
  // tools the events' visible_tools are the universe, and there is nothing to check against.
  if (a.tools.length) {
    const declared = new Set(a.tools);
    for (const st of steps) {
      const missing = [...new Set(st.sequence.flat().filter((t) => !declared.has(t)))];
      if (missing.length)
        errors.push(
          `step '${st.name}': sequence tool(s) ${missing.map((t) => `'${t}'`).join(', ')} not in the agent's tools`,
        );
    }
  }
  const names = new Set<string>();
  for (const s of a.steps) {
    if (names.has(s.name)) errors.push(`step '${s.name}' is defined twice`);
    names.add(s.name);
  }
  const defaults = a.steps.filter((s) => s.isDefault);
  if (defaults.length > 1)
    errors.push(`more than one default step: ${defaults.map((s) => `'${s.name}'`).join(', ')}`);
  if (errors.length) throw new ConfigError(`agent ${a.tenant_id}/${a.agent_id}: ${errors.join('; ')}`);
  const longest = Math.max(
    0,
    ...steps.flatMap((s) => s.conditions.map((c) => (c.type === 'sequence_match' ? c.groups.length : 0))),
  );
  return {
    tools: a.tools,
    steps,
    byName: new Map(steps.map((s) => [s.name, s])),
    defaultStep: steps.find((s) => s.isDefault) ?? null,
    policy: a.options.violation_policy,
    sticky: a.options.sticky_sequences,
    history: Math.max(HISTORY_MIN, longest),
  };
}

const scopeId = (tenant: string, agent: string) => `${tenant}\u001f${agent}`;

/** Every agent's compiled orchestration. Replacing one agent's is atomic: all of it compiles, or none applies. */
export class Orchestrations {
  private readonly agents = new Map<string, Agent>();
  get(tenant: string, agent: string): Agent | undefined {
    return this.agents.get(scopeId(tenant, agent));
  }
  set(a: AgentOrchestration): void {
    this.agents.set(scopeId(a.tenant_id, a.agent_id), compileAgent(a));
  }
  delete(tenant: string, agent: string): void {
    this.agents.delete(scopeId(tenant, agent));
  }
  get size(): number {
    return this.agents.size;
  }
}

/** The configuration file in either shape; errors name the agent and step. */
export function loadOrchestrationFile(raw: unknown): Orchestrations {
  const parsed = orchestrationFileV1.safeParse(raw);
  if (!parsed.success) {
    // Re-parse against the single-agent shape when the file is not a wrapper: its errors are the helpful ones.
    const isWrapper = typeof raw === 'object' && raw !== null && 'agents' in raw;
    const issues = isWrapper
      ? parsed.error.issues
      : (agentOrchestrationV1.safeParse(raw).error?.issues ?? parsed.error.issues);
    const steps = (isWrapper ? undefined : (raw as { steps?: { name?: unknown }[] } | null)?.steps) ?? [];
    const lines = issues.slice(0, 20).map((i) => {
      const [a, b, ...rest] = i.path;
      if (a === 'steps' && typeof b === 'number') {
        const name = steps[b]?.name;
        return `step ${typeof name === 'string' ? `'${name}'` : `#${b}`}: ${rest.map(String).join('.') || '(step)'}: ${i.message}`;
      }
      return `${i.path.map(String).join('.') || '(root)'}: ${i.message}`;
    });
    throw new ConfigError(`invalid orchestration configuration:\n  ${lines.join('\n  ')}`);
  }
  const agents = 'agents' in parsed.data ? parsed.data.agents : [parsed.data];
  const out = new Orchestrations();
  const errors: string[] = [];
  const listed = new Set<string>();
  for (const a of agents) {
    // The later one would replace the earlier silently (two entries that both left out agent_id are both
    // default/default): refused, as two steps of one name are.
    const id = scopeId(a.tenant_id, a.agent_id);
    if (listed.has(id))
      errors.push(
        `agent ${a.tenant_id}/${a.agent_id} is listed twice (tenant_id and agent_id default to 'default')`,
      );
    listed.add(id);
    try {
      out.set(a);
    } catch (err) {
      errors.push(err instanceof Error ? err.message : String(err));
    }
  }
  if (errors.length) throw new ConfigError(`invalid orchestration configuration:\n  ${errors.join('\n  ')}`);
  return out;
}
