import { Counter, Gauge } from 'prom-client';
import { z } from 'zod';
import {
  flowCandidateRecordV1,
  flowRegistryRecordV1,
  flowsFileV1,
  id as idSchema,
  LIMITS,
  TOOL_CALLS_EVENT_TYPES,
  toolCallsEventV1,
  type FlowCandidateRecord,
  type FlowRegistryRecord,
  type FlowSelectionRecord,
  type RegisteredFlow,
  type ToolCallsEvent,
} from '../../../schemas/index.js';
import { PaverError, errorMessage } from '../../../shared/errors.js';
import { describeIssues, readConfigFile } from '../../../shared/jsonl.js';
import { zodParser, type Parser } from '../../../shared/kafka/runner.js';
import { createTableFeed } from '../../../shared/kafka/table-feed.js';
import type { Route } from '../../../shared/http.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { RedisFlowStore } from './adapters/redis/store.js';
import { fillVectors, select, type SelectorDeps } from './adapters/selector.js';
import { onCandidate, type PromotionPolicy, type StoredCandidate } from './core/promotion.js';
import { PromptCache } from './core/prompt.js';
import { flowFromCandidate, FlowRegistry, registerManual } from './core/registry.js';
import { DEFAULT_POLICY, type SelectPolicy } from './core/select.js';
import { flowsEnvSchema, policyFileV1, type FlowsEnv, type PolicyFile } from './config.js';

type Inbound = { kind: 'candidate'; r: FlowCandidateRecord } | { kind: 'event'; e: ToolCallsEvent };
type FeedRecord = FlowRegistryRecord | { kind: 'tombstone'; key: string | null };

const selectBody = z
  .object({
    query: z.string().min(1).max(LIMITS.textLength),
    summaries: z.array(z.string().max(LIMITS.textLength)).max(LIMITS.summaries).default([]),
    tenant_id: idSchema.default('default'),
    agent_id: idSchema.default('default'),
  })
  .strict();

async function loadFile<T>(path: string, schema: z.ZodType<T>, what: string): Promise<T> {
  let raw: unknown;
  try {
    raw = await readConfigFile(path);
  } catch (err) {
    throw new PaverError('CONFIG_INVALID', `${what}: cannot read ${path}: ${errorMessage(err)}`);
  }
  const r = schema.safeParse(raw);
  if (!r.success)
    throw new PaverError('CONFIG_INVALID', `${what} ${path}: ${describeIssues(r.error.issues)}`);
  return r.data;
}

export const service: ServiceSpec<FlowsEnv, Inbound> = {
  name: 'flows',
  envSchema: flowsEnvSchema,
  defaultPort: 9104,
  groupId: (env) => env.FLOWS_GROUP_ID,
  async setup({ env, redis, kafka, codec, sink, metrics, log, fatal }) {
    const manualFile = env.FLOWS_FILE ? await loadFile(env.FLOWS_FILE, flowsFileV1, 'FLOWS_FILE') : [];
    const manual = Array.isArray(manualFile) ? manualFile : manualFile.flows;
    const overrides: PolicyFile = env.FLOWS_POLICY_FILE
      ? await loadFile(env.FLOWS_POLICY_FILE, policyFileV1, 'FLOWS_POLICY_FILE')
      : { agents: [] };
    const policyOf = (tenant: string, agent: string) =>
      overrides.agents.find((a) => a.tenant_id === tenant && a.agent_id === agent);
    const promotionPolicy = (tenant: string, agent: string): PromotionPolicy => {
      const o = policyOf(tenant, agent);
      return {
        mode: o?.promotion ?? env.FLOWS_PROMOTION,
        minOccurrences: o?.auto_min_occurrences ?? env.FLOWS_AUTO_MIN_OCCURRENCES,
        minSavings: o?.auto_min_savings ?? env.FLOWS_AUTO_MIN_SAVINGS,
      };
    };
    const selectPolicy = (tenant: string, agent: string): SelectPolicy => {
      const o = policyOf(tenant, agent);
      return {
        ...DEFAULT_POLICY,
        topK: o?.top_k ?? env.FLOWS_TOP_K,
        rrfK: env.FLOWS_RRF_K,
        scoreFloor: o?.score_floor ?? env.FLOWS_SCORE_FLOOR,
        failOpen: o?.fail_open ?? env.FLOWS_FAIL_OPEN,
      };
    };

    const registry = new FlowRegistry();
    const prompts = new PromptCache();
    const store = new RedisFlowStore(redis, env.REDIS_KEY_PREFIX);
    const r = [metrics.registry];
    const selections = new Counter({
      name: 'paver_flows_selections_total',
      help: 'Flow selections, by path.',
      labelNames: ['path'],
      registers: r,
    });
    const modelCalls = new Counter({
      name: 'paver_flows_model_calls_total',
      help: 'Chat model calls, by outcome.',
      labelNames: ['outcome'],
      registers: r,
    });
    const decisions = new Counter({
      name: 'paver_flows_candidate_decisions_total',
      help: 'Candidate state changes, by status.',
      labelNames: ['status'],
      registers: r,
    });
    new Gauge({
      name: 'paver_flows_registered',
      help: 'Flows in the registry.',
      registers: r,
      collect() {
        this.set(registry.size);
      },
    });
    const chatCfg = env.FLOWS_CHAT_URL
      ? { baseUrl: env.FLOWS_CHAT_URL, apiKey: env.FLOWS_CHAT_API_KEY, model: env.FLOWS_CHAT_MODEL }
      : undefined;
    const embCfg = env.FLOWS_EMBEDDINGS_URL
      ? {
          baseUrl: env.FLOWS_EMBEDDINGS_URL,
          apiKey: env.FLOWS_EMBEDDINGS_API_KEY,
          model: env.FLOWS_EMBEDDINGS_MODEL,
        }
      : undefined;
    const selector: SelectorDeps = {
      registry,
      prompts,
      chat: chatCfg,
      embeddings: embCfg,
      budgetMs: env.FLOWS_SELECT_BUDGET_MS,
      onModel: (o) => modelCalls.inc({ outcome: o }),
    };

    const feed = createTableFeed<FeedRecord>({
      service: 'flows',
      topic: env.PAVER_TOPIC_FLOWS,
      groupPrefix: env.FLOWS_GROUP_ID,
      parse: zodParser(flowRegistryRecordV1),
      tombstone: (key) => ({ kind: 'tombstone', key }),
      apply(v) {
        if ('kind' in v) {
          if (v.key) registry.remove(v.key);
          if (v.key) prompts.delete(v.key);
        } else registry.upsert(v.flow);
      },
      env,
      kafka,
      codec,
      sink,
      metrics,
      log,
      onFatal: fatal,
    });
    const publishFlows = (flows: RegisteredFlow[]) =>
      sink.send(
        env.PAVER_TOPIC_FLOWS,
        'flows.v1',
        flows.map((flow) => ({ key: flow.id, value: { schema_version: 1, flow } })),
      );

    let vectorTimer: NodeJS.Timeout | null = null;
    const refreshVectors = async () => {
      if (!embCfg) return;
      await fillVectors(registry, embCfg, env.FLOWS_SELECT_BUDGET_MS * 5).catch((err: Error) =>
        log.warn({ err: err.message }, 'flow embeddings failed; sparse recall only until the next try'),
      );
    };

    async function promote(flow: RegisteredFlow, candidate: StoredCandidate | null) {
      // Topic first, then Redis: a crash in between re-promotes to the same id on redelivery.
      await publishFlows([flow]);
      await store.save(flow.tenant_id, flow.agent_id, candidate ? [candidate] : [], [flow]);
      registry.upsert(flow);
    }

    const scopeOf = (q: URLSearchParams) => ({
      tenant: q.get('tenant_id') ?? 'default',
      agent: q.get('agent_id') ?? 'default',
    });
    const badScope = (s: { tenant: string; agent: string }) =>
      !idSchema.safeParse(s.tenant).success || !idSchema.safeParse(s.agent).success;
    const summary = (c: StoredCandidate) => ({
      dedupe_key: c.record.dedupe_key,
      title: c.record.title,
      status: c.status,
      retracted: c.retracted,
      occurrence_count: c.record.occurrence_count,
      estimated_token_savings: c.record.estimated_token_savings,
      detected_at: c.record.detected_at,
      decided_at: c.decided_at,
    });
    const decide =
      (to: 'promote' | 'reject'): Route['handler'] =>
      async (req) => {
        const s = scopeOf(req.query);
        if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
        const key = req.params.key ?? '';
        const c = (await store.getCandidates(s.tenant, s.agent, [key])).get(key);
        if (!c) return { status: 404, body: { error: `no candidate '${key}' for ${s.tenant}/${s.agent}` } };
        const now = Date.now();
        if (to === 'reject') {
          if (c.status === 'promoted') return { status: 409, body: { error: 'already promoted' } };
          const next: StoredCandidate = { ...c, status: 'rejected', decided_at: now };
          await store.save(s.tenant, s.agent, [next], []);
          decisions.inc({ status: 'rejected' });
          return { status: 200, body: summary(next) };
        }
        if (c.status === 'rejected')
          return { status: 409, body: { error: 'rejected candidates are not promoted' } };
        if (c.retracted && c.status !== 'promoted')
          return { status: 409, body: { error: 'the detector retracted this candidate' } };
        if (!c.record.candidate && !c.record.promotion_effect)
          return { status: 409, body: { error: 'the candidate carries no proposed flow' } };
        const flow = flowFromCandidate(c.record, now);
        await promote(flow, { ...c, status: 'promoted', decided_at: now });
        decisions.inc({ status: 'promoted' });
        return { status: 200, body: { flow } };
      };

    const parseCandidate = zodParser(flowCandidateRecordV1);
    const parseEvent = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
    const parse: Parser<Inbound> = (value, topic) => {
      if (topic === env.PAVER_TOPIC_FLOW_CANDIDATES) {
        const p = parseCandidate(value, topic);
        return p.ok ? { ok: true, value: { kind: 'candidate', r: p.value } } : p;
      }
      const p = parseEvent(value, topic);
      return p.ok ? { ok: true, value: { kind: 'event', e: p.value } } : p;
    };

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS, env.PAVER_TOPIC_FLOW_CANDIDATES],
      extraTopics: [{ topic: env.PAVER_TOPIC_FLOWS, compacted: true }],
      parse,
      async start() {
        await feed.start();
        if (await feed.caughtUp(env.FLOWS_REGISTRY_WAIT_MS))
          log.info({ flows: registry.size }, 'flow registry loaded');
        else log.warn('flows topic not caught up yet; consuming anyway, /readyz says so');
        if (manual.length) {
          const defs = manual;
          const now = Date.now();
          // Hand-written flows join the same registry: published (idempotent by id) so every instance sees them.
          const flows = defs.map((d) =>
            registerManual(d, registry.get(d.tenant_id, d.agent_id, d.id ?? '')?.registered_at ?? now),
          );
          await publishFlows(flows);
          for (const f of flows) registry.upsert(f);
          log.info({ count: flows.length }, 'hand-written flows registered');
        }
        await refreshVectors();
        if (embCfg) vectorTimer = setInterval(() => void refreshVectors(), 30_000).unref();
      },
      readiness: [{ name: 'flow_registry', check: () => feed.isCaughtUp() }],
      async handler(batch) {
        // Candidates, per scope: one read, one MULTI write.
        const byScope = new Map<string, FlowCandidateRecord[]>();
        for (const { value } of batch) {
          if (value.kind !== 'candidate') continue;
          const k = `${value.r.tenant_id}\u001f${value.r.agent_id}`;
          byScope.set(k, [...(byScope.get(k) ?? []), value.r]);
        }
        for (const records of byScope.values()) {
          const { tenant_id: t, agent_id: a } = records[0]!;
          const stored = await store.getCandidates(t, a, [...new Set(records.map((x) => x.dedupe_key))]);
          const changed = new Map<string, StoredCandidate>();
          const promoted: RegisteredFlow[] = [];
          const now = Date.now();
          for (const rec of records) {
            const o = onCandidate(stored.get(rec.dedupe_key), rec, promotionPolicy(t, a), now);
            if (!o) continue;
            stored.set(rec.dedupe_key, o.next);
            changed.set(rec.dedupe_key, o.next);
            if (o.promote) promoted.push(flowFromCandidate(rec, now));
          }
          if (promoted.length) await publishFlows(promoted);
          await store.save(t, a, [...changed.values()], promoted);
          for (const f of promoted) registry.upsert(f);
          for (const c of changed.values()) decisions.inc({ status: c.status });
        }
        // Selections, per user message.
        const out: FlowSelectionRecord[] = [];
        for (const { value } of batch) {
          if (value.kind !== 'event' || value.e.type !== 'user_message') continue;
          const e = value.e;
          const sel = await select(
            selector,
            e.tenant_id,
            e.agent_id,
            e.text,
            e.episode_summaries ?? [],
            selectPolicy(e.tenant_id, e.agent_id),
          );
          selections.inc({ path: sel.path });
          out.push({
            schema_version: 1,
            tenant_id: e.tenant_id,
            agent_id: e.agent_id,
            session_id: e.session_id,
            event_id: e.event_id,
            ts: e.ts,
            ...sel,
          });
        }
        await sink.send(
          env.PAVER_TOPIC_FLOW_SELECTIONS,
          'flow-selections.v1',
          out.map((v) => ({ key: v.session_id, value: v })),
        );
      },
      routes: [
        {
          method: 'GET',
          path: '/flows/candidates',
          async handler(req) {
            const s = scopeOf(req.query);
            if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
            const status = req.query.get('status');
            const all = (await store.listCandidates(s.tenant, s.agent)).filter(
              (c) => !status || c.status === status,
            );
            return {
              status: 200,
              body: all
                .sort((x, y) => y.record.estimated_token_savings - x.record.estimated_token_savings)
                .map(summary),
            };
          },
        },
        {
          method: 'GET',
          path: '/flows/candidates/:key',
          async handler(req) {
            const s = scopeOf(req.query);
            if (badScope(s)) return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
            const c = (await store.getCandidates(s.tenant, s.agent, [req.params.key ?? ''])).get(
              req.params.key ?? '',
            );
            return c
              ? { status: 200, body: { ...summary(c), record: c.record } }
              : { status: 404, body: { error: 'no such candidate' } };
          },
        },
        { method: 'POST', path: '/flows/candidates/:key/promote', handler: decide('promote') },
        { method: 'POST', path: '/flows/candidates/:key/reject', handler: decide('reject') },
        {
          method: 'GET',
          path: '/flows',
          handler(req) {
            const s = scopeOf(req.query);
            return {
              status: 200,
              body: registry
                .list(s.tenant, s.agent)
                .map((f) => ({ id: f.id, name: f.name, source: f.source, dedupe_key: f.dedupe_key ?? null })),
            };
          },
        },
        {
          method: 'POST',
          path: '/flows/select',
          async handler(req) {
            const b = selectBody.safeParse(await req.body());
            if (!b.success) return { status: 400, body: { error: describeIssues(b.error.issues) } };
            const sel = await select(
              selector,
              b.data.tenant_id,
              b.data.agent_id,
              b.data.query,
              b.data.summaries,
              selectPolicy(b.data.tenant_id, b.data.agent_id),
            );
            selections.inc({ path: sel.path });
            return { status: 200, body: sel };
          },
        },
      ],
      close: async () => {
        if (vectorTimer) clearInterval(vectorTimer);
        await feed.stop();
      },
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
