import type { agentEvents } from '../../../../testkit/streams.js';

// Each task opens with its user's request (issue 14), worded after the workflow it runs, with the
// numbers, ids and emails real requests carry; only its terms may reach the candidates.
const REQUESTS: Record<string, string> = {
  file_read: 'Please validate the deployment config and apply it, ticket 4711',
  web_search: 'Research competitor pricing online and summarize it for ann@example.com',
  git_diff: 'Review my diff: run the linter and the tests on branch feat_x2',
  sql_query: 'Query the monthly sales report and email it to finance, id 99812',
};
export type StreamEvent = ReturnType<typeof agentEvents> extends Iterable<infer E> ? E : never;
export function withRequests(evs: StreamEvent[]): (Record<string, unknown> & { session_id: string })[] {
  const tools = new Map<string, string[]>();
  for (const e of evs) if ('tool' in e) tools.set(e.task_id, [...(tools.get(e.task_id) ?? []), e.tool]);
  const seen = new Set<string>();
  return evs.flatMap((e) => {
    if (seen.has(e.task_id)) return [e];
    seen.add(e.task_id);
    const first = (tools.get(e.task_id) ?? []).find((t) => t in REQUESTS);
    if (first === undefined) return [e];
    const { ts, tenant_id, agent_id, session_id, task_id } = e;
    const text = REQUESTS[first]!;
    const msg = {
      ts,
      tenant_id,
      agent_id,
      session_id,
      task_id,
      type: 'user_message',
      event_id: `${task_id}:user`,
      text,
    };
    return [msg, e];
  });
}
