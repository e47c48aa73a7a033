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
import { RedisTaskStore, type TaskRef } from './adapters/redis/task-store.js';
import { Catalog, CatalogError, loadCatalogFile } from './core/catalog.js';
import { decide, newTaskState, type TaskState } from './core/decide.js';
import { SchemaCompiler } from './core/schema-compiler.js';
import { autoseqEnvSchema, optionsFromEnv, type AutoseqEnv } from './config.js';

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
      help: 'Tool calls the agent runtime executed from a unique decision (one LLM step saved each).',
      registers: r,
    });
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
        for (const { value: e } of batch) {
          if (e.type === 'tool_call')
            refs.set(`${e.tenant_id}\u001f${e.agent_id}\u001f${e.task_id}`, {
              tenant: e.tenant_id,
              agent: e.agent_id,
              task: e.task_id,
            });
        }
        if (refs.size === 0) return;
        const states = await store.load(refs);
        const dirty = new Map<string, { ref: TaskRef; state: TaskState }>();
        const out: NextActionRecord[] = [];
        for (const { value: e } of batch) {
          if (e.type !== 'tool_call') continue;
          const id = `${e.tenant_id}\u001f${e.agent_id}\u001f${e.task_id}`;
          const end = decisionSeconds.startTimer();
          const d = decide(e, catalog, states.get(id) ?? newTaskState(), opts, sha256);
          end();
          if (d.duplicate) {
            duplicates.inc();
            continue;
          }
          states.set(id, d.task);
          dirty.set(id, { ref: refs.get(id)!, state: d.task });
          out.push(...d.records);
        }
        // Publish first, then store: a crash in between re-decides the same events to the same records.
        await sink.send(
          env.PAVER_TOPIC_NEXT_ACTIONS,
          'next-actions.v1',
          out.map((rec) => ({ key: rec.session_id, value: rec })),
        );
        await store.save(dirty);
        for (const rec of out) {
          decisions.inc({ event_type: rec.event_type, reason: rec.reason ?? '' });
          if (rec.event_type === 'auto_seq_executed') saved.inc();
        }
      },
      close: () => feed.stop(),
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
