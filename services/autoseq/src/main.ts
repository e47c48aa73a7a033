import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1, type ToolCallsEvent } from '../../../schemas/index.js';
import { PaverError, errorMessage } from '../../../shared/errors.js';
import { readConfigFile } from '../../../shared/jsonl.js';
import { zodParser } from '../../../shared/kafka/runner.js';
import { createEpoch } from '../../../shared/redis/epoch.js';
import { createStateGuard } from '../../../shared/redis/rebuild.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { createBatchHandler } from './adapters/batch.js';
import { createCatalogFeed } from './adapters/catalog-feed.js';
import { rulesRoute } from './adapters/http.js';
import { createAutoseqMetrics } from './adapters/metrics.js';
import { RedisTaskStore, taskKey } from './adapters/redis/task-store.js';
import { readScope, RedisLearnStore } from './adapters/redis/learn-store.js';
import { Catalog, CatalogError, loadCatalogFile } from './core/catalog.js';
import { SchemaCompiler } from './core/schema-compiler.js';
import { autoseqEnvSchema, learnOptionsFromEnv, optionsFromEnv, type AutoseqEnv } from './config.js';

async function initialCatalog(file: string | undefined, compiler: SchemaCompiler): Promise<Catalog> {
  if (!file) return new Catalog(compiler);
  try {
    return loadCatalogFile(await readConfigFile(file), compiler);
  } catch (err) {
    const why = err instanceof CatalogError ? err.message : `cannot read ${file}: ${errorMessage(err)}`;
    throw new PaverError('CONFIG_INVALID', `AUTOSEQ_CATALOG_FILE: ${why}`);
  }
}

export const service: ServiceSpec<AutoseqEnv, ToolCallsEvent> = {
  name: 'autoseq',
  envSchema: autoseqEnvSchema,
  defaultPort: 9102,
  groupId: (env) => env.AUTOSEQ_GROUP_ID,
  async setup({ env, redis, sink, metrics, log, runtime }) {
    const catalog = await initialCatalog(env.AUTOSEQ_CATALOG_FILE, new SchemaCompiler());
    const prefix = env.REDIS_KEY_PREFIX;
    const store = new RedisTaskStore(redis, prefix, env.AUTOSEQ_TASK_TTL_MS);
    const learnOptions = learnOptionsFromEnv(env);
    const m = createAutoseqMetrics(metrics.registry, () => catalog.size.tools);
    const feed = createCatalogFeed(
      catalog,
      {
        topic: env.PAVER_TOPIC_TOOL_CATALOG,
        groupPrefix: env.AUTOSEQ_GROUP_ID,
        onApplied: (outcome, n) => m.catalogUpdates.inc({ outcome }, n),
      },
      runtime,
    );

    /**
     * Redis loss: the learned rules are statistics over the whole stream (decayed), not records Kafka keeps
     * in a form to replay cheaply, and task states are short-lived; both start over. The guard makes the loss
     * visible (a metric, a warning, /readyz false until it is noticed) instead of silent. See README.
     */
    const guard = createStateGuard({
      epoch: createEpoch(redis, `${prefix}:aseq:epoch`),
      log,
      rebuild: async (reason) => {
        if (reason === 'lost') {
          m.stateLosses.inc();
          m.activeByScope.clear();
          log.warn('learned rules and task states lost with redis: learning starts over from the stream');
        }
      },
    });
    const handle = createBatchHandler({
      catalog,
      store,
      loadLearn: env.AUTOSEQ_LEARN_ENABLED
        ? (events, ctx, positions) =>
            RedisLearnStore.load(
              redis,
              prefix,
              env.AUTOSEQ_TASK_TTL_MS,
              learnOptions,
              events,
              {
                ttlMs: env.AUTOSEQ_LEARN_LEASE_MS,
                heartbeat: ctx.heartbeat,
                isRunning: ctx.isRunning,
                onWait: () => m.leaseWaits.inc(),
              },
              positions,
            )
        : null,
      taskKey: (ref) => taskKey(prefix, ref),
      opts: optionsFromEnv(env),
      lopts: learnOptions,
      sink,
      topic: env.PAVER_TOPIC_NEXT_ACTIONS,
      metrics: m,
    });

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      extraTopics: [{ topic: env.PAVER_TOPIC_TOOL_CATALOG, compacted: true }],
      parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
      async start() {
        // Redis not reachable yet: the first batch (or /readyz probe) checks again; the guard logs failures.
        await guard.ensure().catch(() => undefined);
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
      readiness: [
        { name: 'tool_catalog', check: () => feed.isCaughtUp() },
        { name: 'redis_state', check: () => guard.ready() },
      ],
      async handler(batch, ctx) {
        await guard.ensure();
        return handle(batch, ctx);
      },
      routes: [rulesRoute((tenant, agent) => readScope(redis, prefix, tenant, agent), learnOptions)],
      close: () => feed.stop(),
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
