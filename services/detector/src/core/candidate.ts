import type {
  FlowCandidate,
  FlowCandidateRecord,
  FlowStep,
  RequestTerms,
} from '../../../../schemas/index.js';
import { COST_SCALE } from './ops.js';
import type { DetectorParams } from './params.js';
import { toolsOfDedupeKey, type Selected } from './select.js';
import { DESCRIPTION_TERMS } from './terms.js';

export function titleCase(tool: string): string {
  return tool
    .split(/[_\-.\s/:]+/)
    .filter(Boolean)
    .map((w) => w.charAt(0).toUpperCase() + w.slice(1).toLowerCase())
    .join(' ');
}

export const flowNameOf = (tools: readonly string[]): string => `Auto: ${tools.join(' → ')}`;

/** A candidate record's title, active or retracted: the tool names as they are, never as escaped in the key. */
const titleOf = (tools: readonly string[]): string => `Auto-Flow: ${tools.join(' → ')}`;

function steps(tools: readonly string[]): FlowStep[] {
  return tools.map((tool, i) => ({
    id: `step_${i + 1}`,
    name: titleCase(tool),
    skill_key: tool,
    depends_on: i === 0 ? [] : [`step_${i}`],
    output_key: `step_${i + 1}`,
    retry_max: 2,
    retry_backoff: 1.0,
    timeout_seconds: 120,
    on_failure: 'stop',
    // Linear chain: the first step takes the trigger's input, each next one the previous step's output.
    input_map: { input: i === 0 ? '{{_trigger.input}}' : `{{step_${i}.output}}` },
  }));
}

/**
 * The flow's description: what it does, then the words users asked with (so that selection, lexical or by a
 * model, can match a request in the users' own words rather than in tool names).
 */
export function describeFlow(s: Selected, terms: RequestTerms | undefined): string {
  const base = `Auto-generated from ${s.support} observed repetitions of a ${s.tools.length}-step tool sequence.`;
  const top = (terms?.terms ?? []).slice(0, DESCRIPTION_TERMS).map((t) => t.term);
  return top.length === 0 ? base : `${base} Requests: ${top.join(', ')}.`;
}

/** The candidate shape of flow-sequence-detector.txt, plus the request terms when they are kept. */
export function toCandidate(s: Selected, p: DetectorParams, terms?: RequestTerms): FlowCandidate {
  const name = flowNameOf(s.tools);
  return {
    tool_sequence: [...s.tools],
    occurrence_count: s.support,
    match_type: s.exact >= p.minOccurrences ? 'exact' : 'subsequence',
    estimated_token_savings: s.savingsHundredths / 100,
    avg_cost_per_execution: Math.round(s.cost / s.support) / COST_SCALE,
    dedupe_key: s.dedupeKey,
    proposed_flow: {
      name,
      description: describeFlow(s, terms),
      steps: steps(s.tools),
      tags: ['auto-generated', 'flow-offload'],
    },
    ...(terms ? { request_terms: terms } : {}),
  };
}

/** The adaptation payload published on the flow-candidates topic. */
export function toRecord(
  c: FlowCandidate,
  scope: { tenant: string; agent: string },
  now: number,
): FlowCandidateRecord {
  const perRun = Math.round(c.avg_cost_per_execution * 0.95 * 100) / 100;
  return {
    schema_version: 1,
    status: 'active',
    tenant_id: scope.tenant,
    agent_id: scope.agent,
    dedupe_key: c.dedupe_key,
    detected_at: now,
    title: titleOf(c.tool_sequence),
    source_kind: 'tool_sequence',
    occurrence_count: c.occurrence_count,
    estimated_token_savings: c.estimated_token_savings,
    candidate: c,
    promotion_effect: {
      effect_type: 'flow_offload_registration',
      proposed_flow: c.proposed_flow,
      agent_prompt_hint: `A deterministic flow '${c.proposed_flow.name}' is available for this pattern. Use flow_run('${c.proposed_flow.name}') instead of reasoning through these steps manually.`,
      reason: `Detected ${c.occurrence_count} repetitions of a ${c.tool_sequence.length}-step sequence. Offloading saves ~${perRun} cost units per run.`,
    },
  };
}

export function retractedRecord(
  dedupeKey: string,
  scope: { tenant: string; agent: string },
  now: number,
): FlowCandidateRecord {
  return {
    schema_version: 1,
    status: 'retracted',
    tenant_id: scope.tenant,
    agent_id: scope.agent,
    dedupe_key: dedupeKey,
    detected_at: now,
    // A retraction carries no candidate: the key is all it has of the tools (a Redis loss leaves only keys).
    title: titleOf(toolsOfDedupeKey(dedupeKey)),
    source_kind: 'tool_sequence',
    occurrence_count: 0,
    estimated_token_savings: 0,
    candidate: null,
    promotion_effect: null,
  };
}

/** `%` and `/` escaped, nothing else: the separator cannot occur inside a part, and every other id keeps its key. */
const keyPart = (s: string): string => s.replace(/%/g, '%25').replace(/\//g, '%2F');

/**
 * Kafka key of a candidate record: scoped, so that compaction never merges two agents' candidates. In tenant and
 * agent, `/` (and `%`, so that the escape reads one way) is escaped: ids may hold '/', and `acme` + `sales/bot`
 * shared a key with `acme/sales` + `bot`, so compaction kept one tenant's record. Only ids holding either
 * change key (a wider encoding moved ids with spaces, `@` or `:` to new keys, their old records left on the
 * topic for ever).
 */
export const candidateKey = (scope: { tenant: string; agent: string }, dedupeKey: string): string =>
  `${keyPart(scope.tenant)}/${keyPart(scope.agent)}/${dedupeKey}`;

/**
 * Which published candidates changed: `published` maps dedupe_key → the candidate's JSON as last published.
 * Returns the records to publish (new or changed ones active, dropped ones retracted).
 */
export function diffCandidates(
  published: ReadonlyMap<string, string>,
  live: readonly FlowCandidate[],
): { upserts: FlowCandidate[]; retracts: string[]; next: Map<string, string> } {
  const next = new Map<string, string>();
  const upserts: FlowCandidate[] = [];
  for (const c of live) {
    const json = JSON.stringify(c);
    next.set(c.dedupe_key, json);
    if (published.get(c.dedupe_key) !== json) upserts.push(c);
  }
  const retracts = [...published.keys()].filter((k) => !next.has(k));
  return { upserts, retracts, next };
}
