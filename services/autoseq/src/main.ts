import { Counter, Gauge, Histogram } from 'prom-client';
import {
  TOOL_CALLS_EVENT_TYPES,
  toolCallsEventV1,
  type NextActionRecord,
  type ToolCallsEvent,
} from '../../../schemas/index.js';
import { PaverError, errorMessage } from '../../../shared/errors.js';
import { sha256 } from '../../../shared/hash.js';
import { readConfigFile } from '../../../shared/jsonl.js';
import { zodParser } from '../../../shared/kafka/runner.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { createCatalogFeed } from './adapters/catalog-feed.js';
import { RedisTaskStore, taskKey, type TaskRef } from './adapters/redis/task-store.js';
import { readScope, RedisLearnStore, type BatchRef } from './adapters/redis/learn-store.js';
import { applyEvent, scopeId, typedProposal } from './core/learn/engine.js';
import { listRules, type ArgsValidator } from './core/learn/learner.js';
import { learnedExecutable, learnedRecord } from './core/learn/record.js';
import { payloadShape } from './core/shape.js';
import { Catalog, CatalogError, loadCatalogFile } from './core/catalog.js';
import { decide, newTaskState, type TaskState } from './core/decide.js';
import { SchemaCompiler } from './core/schema-compiler.js';
import { autoseqEnvSchema, learnOptionsFromEnv, optionsFromEnv, type AutoseqEnv } from './config.js';

export const service: ServiceSpec<AutoseqEnv, ToolCallsEvent> = {
  name: 'autoseq',
  envSchema: autoseqEnvSchema,
  defaultPort: 9102,
  groupId: (env) => env.AUTOSEQ_GROUP_ID,
  async setup({ env, redis, kafka, codec, sink, metrics, log, fatal }) {
    const compiler = new SchemaCompiler();
    let catalog = new Catalog(compiler);
    if (env.AUTOSEQ_CATALOG_FILE) {
      try {
        catalog = loadCatalogFile(await readConfigFile(env.AUTOSEQ_CATALOG_FILE), compiler);
      } catch (err) {
        const why =
          err instanceof CatalogError
            ? err.message
            : `cannot read ${env.AUTOSEQ_CATALOG_FILE}: ${errorMessage(err)}`;
        throw new PaverError('CONFIG_INVALID', `AUTOSEQ_CATALOG_FILE: ${why}`);
      }
    }
    const opts = optionsFromEnv(env);
    const store = new RedisTaskStore(redis, env.REDIS_KEY_PREFIX, env.AUTOSEQ_TASK_TTL_MS);
    const r = [metrics.registry];
    const decisions = new Counter({
      name: 'paver_autoseq_decisions_total',
      help: 'Auto-seq records published, by event type and skip reason.',
      labelNames: ['event_type', 'reason'],
      registers: r,
    });
    const saved = new Counter({
      name: 'paver_autoseq_llm_steps_saved_total',
      help: 'LLM steps saved: calls executed from a unique decision, or equal (tool and arguments) to an active proposal.',
      registers: r,
    });
    const proposals = new Counter({
      name: 'paver_autoseq_proposals_total',
      help: 'Proposals held for a next call and scored when it came (or the task ended), by origin, state and outcome.',
      labelNames: ['origin', 'state', 'outcome'],
      registers: r,
    });
    const transitions = new Counter({
      name: 'paver_autoseq_rule_transitions_total',
      help: 'Learned rule state changes, by target state.',
      labelNames: ['to'],
      registers: r,
    });
    const activeByScope = new Map<string, number>();
    new Gauge({
      name: 'paver_autoseq_active_rules',
      help: 'Active learned rules in the scopes this instance has processed.',
      registers: r,
      collect() {
        let n = 0;
        for (const v of activeByScope.values()) n += v;
        this.set(n);
      },
    });
    const lopts = learnOptionsFromEnv(env);
    const validate: ArgsValidator = (who, tool, args) => {
      const t = catalog.scope(who.tenant_id, who.agent_id)?.tools.get(tool);
      return t ? t.validate(args) : undefined;
    };
    const duplicates = new Counter({
      name: 'paver_autoseq_redelivered_events_total',
      help: 'Tool-call events already decided (redelivery), ignored.',
      registers: r,
    });
    const decisionSeconds = new Histogram({
      name: 'paver_autoseq_decision_seconds',
      help: 'In-process decision time per tool-call event.',
      buckets: [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01],
      registers: r,
    });
    const catalogUpdates = new Counter({
      name: 'paver_autoseq_catalog_updates_total',
      help: 'Tool-catalog topic records, by outcome (rejected ones are dead-lettered).',
      labelNames: ['outcome'],
      registers: r,
    });
    new Gauge({
      name: 'paver_autoseq_catalog_tools',
      help: 'Tools in the catalog in force.',
      registers: r,
      collect() {
        this.set(catalog.size.tools);
      },
    });

    const feed = createCatalogFeed(catalog, {
      topic: env.PAVER_TOPIC_TOOL_CATALOG,
      groupPrefix: env.AUTOSEQ_GROUP_ID,
      env,
      kafka,
      codec,
      sink,
      metrics,
      log,
      onFatal: fatal,
      onApplied: (outcome, n) => catalogUpdates.inc({ outcome }, n),
    });

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      extraTopics: [{ topic: env.PAVER_TOPIC_TOOL_CATALOG, compacted: true }],
      parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
      async start() {
        await feed.start();
        const t0 = Date.now();
        if (await feed.caughtUp(env.AUTOSEQ_CATALOG_WAIT_MS))
          log.info({ ...catalog.size, ms: Date.now() - t0 }, 'tool catalog loaded');
        else
          log.warn(
            { waitedMs: env.AUTOSEQ_CATALOG_WAIT_MS },
            'tool catalog not caught up yet; consuming anyway, /readyz says so',
          );
      },
      readiness: [{ name: 'tool_catalog', check: () => feed.isCaughtUp() }],
      async handler(batch) {
        const refs = new Map<string, TaskRef>();
        const learnRefs: BatchRef[] = [];
        for (const { value: e } of batch) {
          if (e.type === 'tool_call')
            refs.set(`${e.tenant_id}\u001f${e.agent_id}\u001f${e.task_id}`, {
              tenant: e.tenant_id,
              agent: e.agent_id,
              task: e.task_id,
            });
          if (e.task_id !== undefined)
            learnRefs.push({ tenant: e.tenant_id, agent: e.agent_id, task: e.task_id });
        }
        if (learnRefs.length === 0) return;
        const states = await store.load(refs);
        const learn = env.AUTOSEQ_LEARN_ENABLED
          ? await RedisLearnStore.load(redis, env.REDIS_KEY_PREFIX, env.AUTOSEQ_TASK_TTL_MS, learnRefs)
          : null;
        const dirty = new Map<string, { ref: TaskRef; state: TaskState }>();
        const out: NextActionRecord[] = [];
        const scored: { held: boolean; origin: string; state: string; hit: boolean; executed: boolean }[] =
          [];
        const moved: string[] = [];
        for (const { value: e } of batch) {
          if (e.type !== 'tool_call') {
            const lr = learn ? applyEvent(learn, e, lopts, validate) : null;
            if (lr?.held)
              scored.push({
                held: true,
                origin: lr.held.origin,
                state: lr.held.state,
                hit: false,
                executed: false,
              });
            for (const t of lr?.transitions ?? []) moved.push(t.to);
            continue;
          }
          const id = `${e.tenant_id}\u001f${e.agent_id}\u001f${e.task_id}`;
          const end = decisionSeconds.startTimer();
          const d = decide(e, catalog, states.get(id) ?? newTaskState(), opts, sha256);
          if (d.duplicate) {
            end();
            duplicates.inc();
            continue;
          }
          const typedNext = typedProposal(d.records, e.observation);
          const lr = learn ? applyEvent(learn, e, lopts, validate, typedNext) : null;
          let task = d.task;
          let records = d.records.map((rec) =>
            rec.event_type === 'auto_seq_detected_unique' ? { ...rec, origin: 'typed' as const } : rec,
          );
          if (!typedNext && lr?.next) {
            // A learned proposal replaces the typed "none/ambiguous/skipped" record for this event.
            const gate = learnedExecutable(e, lr.next, catalog, task, opts);
            task = gate.task;
            const base = {
              schema_version: 1 as const,
              tenant_id: e.tenant_id,
              agent_id: e.agent_id,
              session_id: e.session_id,
              task_id: e.task_id,
              event_id: e.event_id,
              step: e.step,
              ts: e.ts,
            };
            records = [
              ...records.filter((rec) => rec.event_type === 'auto_seq_executed'),
              learnedRecord(base, payloadShape(e.observation, sha256), lr.next, gate.execute),
            ];
          }
          end();
          if (lr?.held)
            scored.push({
              held: true,
              origin: lr.held.origin,
              state: lr.held.state,
              hit: lr.heldHit === true,
              executed: records.some((rec) => rec.event_type === 'auto_seq_executed'),
            });
          else if (records.some((rec) => rec.event_type === 'auto_seq_executed'))
            scored.push({ held: false, origin: 'typed', state: 'active', hit: false, executed: true });
          for (const t of lr?.transitions ?? []) moved.push(t.to);
          states.set(id, task);
          dirty.set(id, { ref: refs.get(id)!, state: task });
          out.push(...records);
        }
        // Publish first, then store: a crash in between re-decides the same events to the same records.
        await sink.send(
          env.PAVER_TOPIC_NEXT_ACTIONS,
          'next-actions.v1',
          out.map((rec) => ({ key: rec.session_id, value: rec })),
        );
        if (learn) {
          // Typed and learned state in one MULTI: a crash never keeps one without the other.
          await learn.save(
            [...dirty.values()].map(({ ref, state }) => [
              taskKey(env.REDIS_KEY_PREFIX, ref),
              JSON.stringify(state),
            ]),
          );
          for (const s of learn.scopeStates())
            activeByScope.set(
              scopeId(s.tenant, s.agent),
              Object.values(s.state.slots).filter((x) => x.rule?.state === 'active').length,
            );
        } else await store.save(dirty);
        for (const rec of out) decisions.inc({ event_type: rec.event_type, reason: rec.reason ?? '' });
        for (const sc of scored) {
          if (sc.held)
            proposals.inc({ origin: sc.origin, state: sc.state, outcome: sc.hit ? 'hit' : 'miss' });
          if (sc.executed || (sc.hit && sc.state === 'active')) saved.inc();
        }
        for (const to of moved) transitions.inc({ to });
      },
      routes: [
        {
          method: 'GET',
          path: '/rules',
          async handler(req) {
            const tenant = req.query.get('tenant_id') ?? 'default';
            const agent = req.query.get('agent_id') ?? 'default';
            if (!tenant || !agent || tenant.length > 256 || agent.length > 256)
              return { status: 400, body: { error: 'bad tenant_id/agent_id' } };
            const scope = await readScope(redis, env.REDIS_KEY_PREFIX, tenant, agent);
            return {
              status: 200,
              body: { tenant_id: tenant, agent_id: agent, rules: scope ? listRules(scope) : [] },
            };
          },
        },
      ],
      close: () => feed.stop(),
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
