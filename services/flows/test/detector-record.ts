import type { FlowCandidate, FlowCandidateRecord } from '../../../schemas/index.js';
import { dedupeKeyOf } from '../../../shared/core/dedupe-key.js';

/**
 * A candidate record shaped as the detector publishes it (services/detector/src/core/candidate.ts `toRecord`,
 * which a service may not import): its title and proposed flow's name spell out the whole tool sequence, so a
 * long sequence gives texts past what a flow allows.
 */
export const flowNameOf = (tools: readonly string[]) => `Auto: ${tools.join(' → ')}`;
/** The detector's own key builder (shared/core), not a copy: the records carry the keys it publishes. */
export { dedupeKeyOf };

export function detectorRecord(
  tools: string[],
  scope: { tenant?: string; agent?: string; at?: number; title?: string; name?: string } = {},
): FlowCandidateRecord {
  const name = scope.name ?? flowNameOf(tools);
  const c: FlowCandidate = {
    tool_sequence: tools,
    occurrence_count: 20,
    match_type: 'exact',
    estimated_token_savings: 10,
    avg_cost_per_execution: 1,
    dedupe_key: dedupeKeyOf(tools),
    proposed_flow: {
      name,
      description: 'd',
      tags: ['auto-generated', 'flow-offload'],
      steps: tools.map((t, i) => ({
        id: `step_${i + 1}`,
        name: t,
        skill_key: t,
        depends_on: i ? [`step_${i}`] : [],
        output_key: `step_${i + 1}`,
        retry_max: 0,
        retry_backoff: 1,
        timeout_seconds: 120,
        on_failure: 'stop' as const,
        input_map: {},
      })),
    },
  };
  return {
    schema_version: 1,
    status: 'active',
    tenant_id: scope.tenant ?? 'default',
    agent_id: scope.agent ?? 'default',
    dedupe_key: c.dedupe_key,
    detected_at: scope.at ?? 1,
    title: scope.title ?? `Auto-Flow: ${tools.join(' → ')}`,
    source_kind: 'tool_sequence',
    occurrence_count: c.occurrence_count,
    estimated_token_savings: c.estimated_token_savings,
    candidate: c,
    promotion_effect: {
      effect_type: 'flow_offload_registration',
      proposed_flow: c.proposed_flow,
      agent_prompt_hint: `A deterministic flow '${name}' is available for this pattern. Use flow_run('${name}') instead of reasoning through these steps manually.`,
      reason: `Detected ${c.occurrence_count} repetitions of a ${tools.length}-step sequence.`,
    },
  };
}
