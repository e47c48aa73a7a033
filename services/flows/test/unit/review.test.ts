import { describe, expect, it } from 'vitest';
import { CONTRACTS, type RegisteredFlow, type ToolCallsEvent } from '../../../../schemas/index.js';
import {
  FlowsEngine,
  refKey,
  type CandidateStore,
  type EndedSession,
  type SessionStore,
} from '../../src/adapters/engine.js';
import type { OpenSession } from '../../src/core/sessions.js';
import { OutcomeBook, type PastRun } from '../../src/core/outcomes.js';
import type { PromotionPolicy, StoredCandidate } from '../../src/core/promotion.js';
import { PromptCache } from '../../src/core/prompt.js';
import { FlowRegistry } from '../../src/core/registry.js';
import { DEFAULT_POLICY } from '../../src/core/select.js';

/** An engine over a map-based candidate store (the replay's), with the sink's contract check on publish. */
function mapEngine(policy: PromotionPolicy, sessions?: SessionStore) {
  const candidates = new Map<string, StoredCandidate>();
  const ck = (t: string, a: string, k: string) => `${t}\u001f${a}\u001f${k}`;
  const store: CandidateStore = {
    async read(t, a, keys) {
      const out = new Map<string, StoredCandidate>();
      for (const k of keys) {
        const c = candidates.get(ck(t, a, k));
        if (c) out.set(k, c);
      }
      return { candidates: out, versions: new Map() };
    },
    async write(t, a, _read, cs) {
      for (const c of cs) candidates.set(ck(t, a, c.record.dedupe_key), c);
      return true;
    },
    flows: async () => [],
  };
  const registry = new FlowRegistry();
  const published: RegisteredFlow[] = [];
  const runs = new Map<string, PastRun[]>();
  const e = new FlowsEngine({
    store,
    // What shared/kafka/sink.ts send() does before a record leaves: the flows.v1 contract, else INTERNAL.
    publishFlows: async (fs) => {
      for (const flow of fs) CONTRACTS['flows.v1']!.schema.parse({ schema_version: 1, flow });
      published.push(...fs);
    },
    selector: {
      registry,
      prompts: new PromptCache(),
      budgetMs: 100,
      outcomes: new OutcomeBook({ capacity: 50, neighbours: 10, wrongCost: 4 }),
    },
    promotionPolicy: () => policy,
    selectPolicy: () => DEFAULT_POLICY,
    now: () => 1000,
    ...(sessions ? { sessions } : {}),
    runs: {
      load: async (t, a) => [...(runs.get(`${t}/${a}`) ?? [])],
      append: async (t, a, run) => void runs.set(`${t}/${a}`, [...(runs.get(`${t}/${a}`) ?? []), run]),
    },
  });
  return { e, registry, published, runs };
}

const MANUAL: PromotionPolicy = {
  mode: 'manual',
  minOccurrences: 10,
  minSavings: 0,
  shadowTrials: 5,
  shadowPrecision: 0.5,
};

/** A session store over a map, keyed as Redis keys it (scope and session id), copying through JSON. */
function jsonSessions(): SessionStore {
  const kept = new Map<string, string>();
  const k = (r: { tenant: string; agent: string; session: string }) => `${r.tenant}/${r.agent}/${r.session}`;
  return {
    async load(refs) {
      const out = new Map<string, OpenSession | EndedSession>();
      for (const r of refs) {
        const v = kept.get(k(r));
        if (v) out.set(refKey(r), JSON.parse(v) as OpenSession | EndedSession);
      }
      return out;
    },
    async save(open, ended) {
      for (const { ref, s } of open) kept.set(k(ref), JSON.stringify(s));
      for (const { ref, at } of ended) kept.set(k(ref), JSON.stringify({ ended: true, at }));
    },
  };
}

let ts = 1;
const ev = (
  agent: string,
  session: string,
  type: ToolCallsEvent['type'],
  extra: Record<string, unknown> = {},
  eventId = `${agent}:${session}:${ts}`,
): ToolCallsEvent =>
  ({
    tenant_id: 'default',
    agent_id: agent,
    session_id: session,
    task_id: session,
    type,
    event_id: eventId,
    ts: ts++,
    ...extra,
  }) as ToolCallsEvent;

describe('review: event_id is not the idempotency key', () => {
  // Fails until the defect it shows is fixed (a later commit).
  it.fails('a tool_call produced twice (same event_id, two offsets) counts once in the run', async () => {
    const { e, runs } = mapEngine(MANUAL, jsonSessions());
    const call = ev('a', 's9', 'tool_call', { step: 0, tool: 'lookup' }, 's9:call0');
    const evs = [
      ev('a', 's9', 'user_message', { text: 'close my account' }, 's9:u'),
      call,
      call, // a producer retry: the same event at the next offset
      ev('a', 's9', 'tool_call', { step: 1, tool: 'close' }, 's9:call1'),
      ev('a', 's9', 'task_completed', {}, 's9:done'),
    ];
    await e.handle(evs.map((x, i) => ({ kind: 'event' as const, e: x, partition: 0, offset: String(i) })));
    expect(runs.get('default/a')?.map((r) => r.calls)).toEqual([['lookup', 'close']]);
  });
});
