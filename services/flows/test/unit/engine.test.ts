import { describe, expect, it } from 'vitest';
import type { FlowCandidateRecord, ToolCallsEvent } from '../../../../schemas/index.js';
import {
  FlowsEngine,
  refKey,
  type CandidateStore,
  type EndedSession,
  type SessionStore,
} from '../../src/adapters/engine.js';
import { MAX_ENDED_SESSIONS, type OpenSession } from '../../src/core/sessions.js';
import { EvidenceBook } from '../../src/core/dataflow.js';
import { OutcomeBook, pastRunsOf, type PastRun } from '../../src/core/outcomes.js';
import type { PromotionPolicy, StoredCandidate } from '../../src/core/promotion.js';
import { PromptCache } from '../../src/core/prompt.js';
import { FlowRegistry, promotedFlowId } from '../../src/core/registry.js';
import { DEFAULT_POLICY } from '../../src/core/select.js';

const AUTO: PromotionPolicy = {
  mode: 'auto',
  minOccurrences: 100,
  minSavings: 0,
  shadowTrials: 5,
  shadowPrecision: 0.5,
};

/** An engine over in-memory stores (the replay's setup); `runs` stands for the Redis list of past runs. */
function engine(
  runs: Map<string, PastRun[]>,
  evidenceRuns = 200,
  outcomes = new OutcomeBook({ capacity: 3, neighbours: 10, wrongCost: 4 }),
  sessions?: SessionStore,
) {
  const none: CandidateStore = {
    read: async () => ({ candidates: new Map(), versions: new Map() }),
    write: async () => true,
    flows: async () => [],
  };
  return new FlowsEngine({
    store: none,
    publishFlows: async () => undefined,
    selector: {
      registry: new FlowRegistry(),
      prompts: new PromptCache(),
      budgetMs: 100,
      outcomes,
    },
    promotionPolicy: () => AUTO,
    selectPolicy: () => DEFAULT_POLICY,
    now: () => 0,
    evidenceRuns,
    ...(sessions ? { sessions } : {}),
    runs: {
      load: async (t, a) => [...(runs.get(`${t}/${a}`) ?? [])],
      append: async (t, a, run) => void runs.set(`${t}/${a}`, [...(runs.get(`${t}/${a}`) ?? []), run]),
    },
  });
}

let ts = 1;
const session = (id: string, text: string, tools: string[]): ToolCallsEvent[] => {
  const base = { tenant_id: 'default', agent_id: 'default', session_id: id, task_id: id };
  return [
    { ...base, type: 'user_message', event_id: `${id}:u`, ts: ts++, text },
    ...tools.map((tool, step): ToolCallsEvent => ({
      ...base,
      type: 'tool_call',
      event_id: `${id}:${step}`,
      ts: ts++,
      step,
      tool,
      args: { n: step },
      observation: { id: `${id}-${step}` },
    })),
    { ...base, type: 'task_completed', event_id: `${id}:done`, ts: ts++ },
  ] as ToolCallsEvent[];
};
const feed = (e: FlowsEngine, evs: ToolCallsEvent[]) => e.handle(evs.map((x) => ({ kind: 'event', e: x })));
/** The tools of each run the default scope's outcome memory holds, oldest first. */
const callsIn = (book: OutcomeBook) =>
  book
    .memory('default', 'default')!
    .all()
    .map((r) => r.calls);

/**
 * A session store over a map that copies in and out as Redis does (JSON): nothing is shared by reference.
 * `withRequests`: an end keeps its request ids, as the Redis store's end mark does.
 */
function jsonSessions(withRequests = false) {
  const kept = new Map<string, string>();
  const sessions: SessionStore = {
    async load(refs) {
      const out = new Map<string, OpenSession | EndedSession>();
      for (const r of refs) {
        const v = kept.get(r.session);
        if (v) out.set(refKey(r), JSON.parse(v) as OpenSession | EndedSession);
      }
      return out;
    },
    async save(open, ended) {
      for (const { ref, s } of open) kept.set(ref.session, JSON.stringify(s));
      for (const { ref, at, requests } of ended)
        kept.set(
          ref.session,
          JSON.stringify({ ended: true, at, ...(withRequests && requests ? { requests } : {}) }),
        );
    },
  };
  return { kept, sessions };
}

describe('flows engine: past runs as the offline commands see them', () => {
  it('the runs the engine records equal pastRunsOf over the same events (two tasks of one session, a call before the request, a task never completed)', async () => {
    const two = [...session('s1', 'refund my order', ['get_order', 'refund'])];
    const second = session('s1b', 'book a flight to Paris', ['search_flights', 'book']).map(
      (e) => ({ ...e, session_id: 's1' }) as ToolCallsEvent,
    );
    const early = session('s2', 'change my seat', ['seat_map', 'change_seat']);
    const [msg, ...rest] = early;
    const stray = { ...rest[0]!, event_id: 's2:stray' } as ToolCallsEvent;
    const open = session('s3', 'cancel my trip', ['find_trip']).slice(0, -1);
    const events = [...two, ...second, stray, msg!, ...rest, ...open];
    const runs = new Map<string, PastRun[]>();
    await feed(engine(runs, 200, new OutcomeBook({ capacity: 50, neighbours: 10, wrongCost: 4 })), events);
    const service = runs.get('default/default')!;
    expect(service.map((r) => r.calls)).toEqual([
      ['get_order', 'refund'],
      ['search_flights', 'book'],
      ['seat_map', 'change_seat'],
    ]);
    expect(pastRunsOf(events, 50)).toEqual(service);
  });

  it('past the bounds of ended sessions in memory, pastRunsOf still equals the runs the engine records', async () => {
    // Session 0's end is the oldest of MAX_ENDED_SESSIONS + 1: the engine has forgotten its request ids (no store
    // to read them back from) when its request comes again (same event_id), so that request opens a session.
    const events: ToolCallsEvent[] = [];
    for (let i = 0; i <= MAX_ENDED_SESSIONS; i++) events.push(...session(`e${i}`, 'refund my order', []));
    events.push(...session('e0', 'refund my order', ['get_order']));
    const runs = new Map<string, PastRun[]>();
    const e = engine(runs, 0, new OutcomeBook({ capacity: 20_000, neighbours: 10, wrongCost: 4 }));
    for (let i = 0; i < events.length; i += 1_000) await feed(e, events.slice(i, i + 1_000));
    const service = runs.get('default/default')!;
    expect(service.at(-1)?.calls).toEqual(['get_order']);
    expect(pastRunsOf(events, 20_000)).toEqual(service);
  });
});

describe('flows engine: what survives a restart', () => {
  it('a new process starts from the persisted past runs, older ones first, then adds its own', async () => {
    const runs = new Map<string, PastRun[]>();
    const first = engine(runs);
    await feed(first, session('a', 'close my account', ['lookup', 'close']));
    await feed(first, session('b', 'review my account', ['lookup', 'audit']));
    expect(runs.get('default/default')!.map((r) => r.calls)).toEqual([
      ['lookup', 'close'],
      ['lookup', 'audit'],
    ]);
    const book = new OutcomeBook({ capacity: 3, neighbours: 10, wrongCost: 4 });
    const second = engine(runs, 200, book);
    await feed(second, session('c', 'freeze my account', ['lookup', 'freeze']));
    await feed(second, session('d', 'audit my account', ['lookup', 'audit', 'report']));
    // Bounded by the capacity: the oldest persisted run left first.
    expect(callsIn(book)).toEqual([
      ['lookup', 'audit'],
      ['lookup', 'freeze'],
      ['lookup', 'audit', 'report'],
    ]);
  });

  it("reads a scope's persisted runs once, however many batches (partitions) and selections ask at once", async () => {
    const runs = new Map<string, PastRun[]>([
      [
        'default/default',
        [
          { terms: ['close', 'account'], calls: ['lookup', 'close'] },
          { terms: ['audit', 'account'], calls: ['lookup', 'audit'] },
        ],
      ],
    ]);
    const book = new OutcomeBook({ capacity: 50, neighbours: 10, wrongCost: 4 });
    const e = engine(runs, 200, book);
    // Two partitions' batches of one scope and a selection on demand, all before the first read answers.
    await Promise.all([
      feed(e, session('p0', 'freeze my account', ['lookup', 'freeze']).slice(0, 2)),
      feed(e, session('p1', 'audit my account', ['lookup', 'audit']).slice(0, 2)),
      e.ensureRuns('default', 'default'),
    ]);
    // Before: each batch added what it read, the persisted runs twice over (the two batches alone).
    expect(callsIn(book)).toEqual([
      ['lookup', 'close'],
      ['lookup', 'audit'],
    ]);
  });

  it('an open session is read back by the next process, and events it already applied are not applied again', async () => {
    const { kept, sessions } = jsonSessions();
    const runs = new Map<string, PastRun[]>();
    const events = session('s', 'close my account', ['lookup', 'freeze', 'close']).map((e, i) => ({
      kind: 'event' as const,
      e,
      partition: 0,
      offset: String(100 + i),
    }));
    const first = engine(runs, 200, undefined, sessions);
    await first.handle(events.slice(0, 3)); // the request and two calls; then the process dies
    expect(JSON.parse(kept.get('s')!)).toMatchObject({ calls: ['lookup', 'freeze'], at: '0:102' });
    const second = engine(runs, 200, undefined, sessions);
    // Its last batch is delivered again (offsets not committed), then the rest.
    const out = await second.handle(events.slice(1));
    expect(out).toEqual([]);
    expect(runs.get('default/default')!.map((r) => r.calls)).toEqual([['lookup', 'freeze', 'close']]);
    expect(JSON.parse(kept.get('s')!)).toEqual({ ended: true, at: '0:104' });
    // The whole session once more (that batch's offsets were not committed either), to a third process: the
    // request still gets its selection, and nothing opens or ends again.
    const third = engine(runs, 200, undefined, sessions);
    expect(await third.handle(events)).toHaveLength(1);
    expect(runs.get('default/default')).toHaveLength(1);
    // The same offsets on another partition are other events.
    const moved = events.map((v) => ({ ...v, partition: 1 }));
    await engine(runs, 200, undefined, sessions).handle(moved);
    expect(runs.get('default/default')).toHaveLength(2);
    // Without the store, a new process would not know the session: its end would count nothing.
    const runsAlone = new Map<string, PastRun[]>();
    await engine(runsAlone).handle(events.slice(3));
    expect(runsAlone.get('default/default')).toBeUndefined();
  });

  it('in a batch that opens more sessions than memory holds, none of them loses an event', async () => {
    const { sessions } = jsonSessions();
    const runs = new Map<string, PastRun[]>();
    const e = engine(runs, 200, undefined, sessions);
    // Memory holds 10,000 open sessions: open 10,001 interleaved, then end them all in a later batch.
    const n = 10_001;
    const opening = Array.from({ length: n }, (_, i) => session(`s${i}`, 'close my account', ['lookup']))
      .flatMap((evs) => evs.slice(0, 2))
      .map((ev, i) => ({ kind: 'event' as const, e: ev, partition: 0, offset: String(i) }));
    await e.handle(opening);
    const ending = Array.from({ length: n }, (_, i) => ({
      kind: 'event' as const,
      e: {
        type: 'task_completed',
        event_id: `s${i}:done`,
        ts: ts++,
        tenant_id: 'default',
        agent_id: 'default',
        session_id: `s${i}`,
        task_id: `s${i}`,
      } as ToolCallsEvent,
      partition: 0,
      offset: String(2 * n + i),
    }));
    await e.handle(ending);
    expect(runs.get('default/default')).toHaveLength(n);
  });

  it('an ended session read from the store and then dropped from memory is read again: a retried request of it opens nothing', async () => {
    const { sessions } = jsonSessions(true);
    const runs = new Map<string, PastRun[]>();
    const at = (ev: ToolCallsEvent, offset: number) => ({
      kind: 'event' as const,
      e: ev,
      partition: 0,
      offset: String(offset),
    });
    const x = session('x', 'close my account', ['lookup', 'close']);
    await engine(runs, 200, undefined, sessions).handle(x.map((ev, i) => at(ev, i)));
    expect(runs.get('default/default')).toHaveLength(1);

    // A restart: a redelivered call of x reads its end mark from the store (x is then known to be in no store as
    // an open session), and 10,000 other sessions end after it, more than memory keeps.
    const e = engine(runs, 200, undefined, sessions);
    await e.handle([at(x[1]!, 1)]);
    const others = Array.from({ length: 10_000 }, (_, i) => session(`o${i}`, 'book a flight', []))
      .flat()
      .map((ev, i) => at(ev, 100 + i));
    // In batches, as a stream comes: one batch of 10,000 new sessions would crowd x out of the sessions known to
    // be in no store by itself.
    for (let i = 0; i < others.length; i += 400) await e.handle(others.slice(i, i + 400));
    const recorded = runs.get('default/default')!.length;
    expect(recorded).toBe(10_001);

    // x's request sent again by its producer (a new offset), then a later end of the session: no phantom run.
    await e.handle([at(x[0]!, 50_000)]);
    await e.handle([at({ ...x[x.length - 1]!, event_id: 'x:done-again' }, 50_001)]);
    expect(runs.get('default/default')).toHaveLength(recorded);
  });

  it('puts pending candidates under shadow trial back into the shadow pool, and only those', () => {
    const e = engine(new Map());
    const rec = (key: string): FlowCandidateRecord => ({
      schema_version: 1,
      status: 'active',
      tenant_id: 'default',
      agent_id: 'default',
      dedupe_key: key,
      detected_at: 1,
      title: key,
      source_kind: 'tool_sequence',
      occurrence_count: 3,
      estimated_token_savings: 1,
      candidate: {
        tool_sequence: ['lookup', 'close'],
        occurrence_count: 3,
        match_type: 'exact',
        estimated_token_savings: 1,
        avg_cost_per_execution: 1,
        dedupe_key: key,
        proposed_flow: {
          name: key,
          description: key,
          tags: [],
          steps: ['lookup', 'close'].map((t, i) => ({
            id: `s${i}`,
            name: t,
            skill_key: t,
            depends_on: [],
            output_key: `o${i}`,
            retry_max: 0,
            retry_backoff: 0,
            timeout_seconds: 30,
            on_failure: 'stop' as const,
            input_map: {},
          })),
        },
      },
      promotion_effect: null,
    });
    const stored = (key: string, status: StoredCandidate['status']): StoredCandidate => ({
      record: rec(key),
      status,
      retracted: false,
      decided_at: null,
      shadow_trials: 2,
      shadow_proposed: 4,
      shadow_matched: 4,
    });
    e.restoreShadow('default', 'default', [
      stored('p', 'pending'),
      stored('r', 'rejected'),
      stored('x', 'promoted'),
    ]);
    expect(e.shadow.list('default', 'default').map((f) => f.id)).toEqual([
      promotedFlowId('default', 'default', 'p'),
    ]);
  });

  it('keeps the last N finished runs per scope as evidence, with arguments and outputs', async () => {
    const e = engine(new Map(), 2);
    for (const id of ['a', 'b', 'c']) await feed(e, session(id, `request ${id}`, ['lookup']));
    const ev = e.evidence.runs('default', 'default');
    expect(ev.map((r) => r.userText)).toEqual(['request b', 'request c']);
    expect(ev[1]!.calls).toEqual([{ tool: 'lookup', args: { n: 0 }, observation: { id: 'c-0' } }]);
    const off = new EvidenceBook(0);
    off.add('default', 'default', { calls: [] });
    expect(off.runs('default', 'default')).toEqual([]);
  });
});

/** A candidate record with a proposed one-step flow (key `k`). */
const rec0 = (): FlowCandidateRecord => ({
  schema_version: 1,
  status: 'active',
  tenant_id: 'default',
  agent_id: 'default',
  dedupe_key: 'k',
  detected_at: 1,
  title: 'k',
  source_kind: 'tool_sequence',
  occurrence_count: 3,
  estimated_token_savings: 1,
  candidate: null,
  promotion_effect: {
    effect_type: 'flow_offload_registration',
    proposed_flow: {
      name: 'k',
      description: 'k',
      tags: [],
      steps: [
        {
          id: 's1',
          name: 'lookup',
          skill_key: 'lookup',
          depends_on: [],
          output_key: 'o1',
          retry_max: 0,
          retry_backoff: 0,
          timeout_seconds: 30,
          on_failure: 'stop',
          input_map: {},
        },
      ],
    },
    agent_prompt_hint: 'k',
    reason: 'k',
  },
});

describe('flows engine: flows published by writes that did not land', () => {
  it('a withdrawal that fails is owed: the next batch makes it before anything else', async () => {
    const rec = (occurrences: number, at: number): FlowCandidateRecord => ({
      ...rec0(),
      occurrence_count: occurrences,
      detected_at: at,
    });
    // One candidate in a map; the first write with a promotion loses to an operator's reject.
    let stored: StoredCandidate | undefined;
    let raced = false;
    const store: CandidateStore = {
      read: async () => ({
        candidates: new Map(stored ? [['k', stored]] : []),
        versions: new Map(),
      }),
      async write(_t, _a, _read, cs, flows) {
        if (flows.length && !raced) {
          raced = true;
          stored = { ...stored!, status: 'rejected', decided_at: 1 };
          return false;
        }
        for (const c of cs) stored = c;
        return true;
      },
      flows: async () => [],
    };
    const published: string[] = [];
    const withdrawn: string[] = [];
    let kafkaDown = true;
    const e = new FlowsEngine({
      store,
      publishFlows: async (fs) => void published.push(...fs.map((f) => f.id)),
      withdrawFlows: async (ids) => {
        if (kafkaDown) throw new Error('broker unreachable');
        withdrawn.push(...ids);
      },
      selector: {
        registry: new FlowRegistry(),
        prompts: new PromptCache(),
        budgetMs: 100,
        outcomes: new OutcomeBook({ capacity: 0, neighbours: 10, wrongCost: 4 }),
      },
      promotionPolicy: () => ({ ...AUTO, minOccurrences: 10, shadowTrials: 0 }),
      selectPolicy: () => DEFAULT_POLICY,
      now: () => 0,
    });
    await e.handle([{ kind: 'candidate', r: rec(3, 1) }]);
    await expect(e.handle([{ kind: 'candidate', r: rec(20, 2) }])).rejects.toThrow('broker unreachable');
    expect(published).toEqual([promotedFlowId('default', 'default', 'k')]);
    expect(stored?.status).toBe('rejected');
    kafkaDown = false;
    await e.handle([]);
    expect(withdrawn).toEqual([promotedFlowId('default', 'default', 'k')]);
    // Settled: nothing more is owed.
    await e.handle([]);
    expect(withdrawn).toHaveLength(1);
  });

  it('states sent by attempts that all lost are written again as they stand, once writes land again', async () => {
    const stored: StoredCandidate = {
      record: { ...rec0(), occurrence_count: 3 },
      status: 'rejected',
      retracted: false,
      decided_at: 1,
      shadow_trials: 0,
      shadow_proposed: 0,
      shadow_matched: 0,
    };
    let losing = true;
    const written: StoredCandidate[][] = [];
    const store: CandidateStore = {
      read: async () => ({ candidates: new Map([['k', stored]]), versions: new Map() }),
      async write(_t, _a, _read, cs) {
        written.push(cs);
        return !losing;
      },
      flows: async () => [],
    };
    const e = new FlowsEngine({
      store,
      publishFlows: async () => undefined,
      selector: {
        registry: new FlowRegistry(),
        prompts: new PromptCache(),
        budgetMs: 100,
        outcomes: new OutcomeBook({ capacity: 0, neighbours: 10, wrongCost: 4 }),
      },
      promotionPolicy: () => AUTO,
      selectPolicy: () => DEFAULT_POLICY,
      now: () => 0,
    });
    // A newer record of a rejected candidate: stored (still rejected), but every attempt loses.
    await expect(e.handle([{ kind: 'candidate', r: { ...rec0(), detected_at: 5 } }])).rejects.toThrow(
      'lost 16 times',
    );
    expect(e.hasOwed).toBe(true);
    losing = false;
    written.length = 0;
    await e.settleOwed();
    // What stands now is written again (the state topic's last word becomes it), and nothing is owed.
    expect(written).toEqual([[stored]]);
    expect(e.hasOwed).toBe(false);
  });
});
