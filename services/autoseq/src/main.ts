import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1, type ToolCallsEvent } from '../../../schemas/index.js';
import { PaverError, errorMessage } from '../../../shared/errors.js';
import { readConfigFile } from '../../../shared/jsonl.js';
import { replayOptions } from '../../../shared/kafka/replay.js';
import { zodParser } from '../../../shared/kafka/runner.js';
import { createEpoch, restoreFlagKey } from '../../../shared/redis/epoch.js';
import {
  createStateGuard,
  ensureHeartbeating,
  restoreCutShort,
  type StateGuard,
} from '../../../shared/redis/rebuild.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { createBatchHandler } from './adapters/batch.js';
import { createCatalogFeed } from './adapters/catalog-feed.js';
import { forgetRoute, guardedScopeRead, rulesRoute } from './adapters/http.js';
import { createAutoseqMetrics } from './adapters/metrics.js';
import { RedisTaskStore, taskKey } from './adapters/redis/task-store.js';
import { readScope, RedisLearnStore, seedActiveRulesGauge } from './adapters/redis/learn-store.js';
import { restoreRules, RuleSnapshots } from './adapters/rules-snapshot.js';
import { retireTiming, ScopeRetirement } from './adapters/scope-retire.js';
import { Catalog, CatalogError, loadCatalogFile } from './core/catalog.js';
import { scopeId } from './core/learn/engine.js';
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
  async setup({ env, redis, sink, metrics, log, runtime, isRunning }) {
    const catalog = await initialCatalog(env.AUTOSEQ_CATALOG_FILE, new SchemaCompiler());
    const prefix = env.REDIS_KEY_PREFIX;
    const store = new RedisTaskStore(redis, prefix, env.AUTOSEQ_TASK_TTL_MS);
    const learnOptions = learnOptionsFromEnv(env);
    const m = createAutoseqMetrics(
      metrics.registry,
      () => catalog.size.tools,
      env.AUTOSEQ_LEARN_SCOPE_TTL_MS,
    );
    const feed = createCatalogFeed(
      catalog,
      {
        topic: env.PAVER_TOPIC_TOOL_CATALOG,
        groupPrefix: env.AUTOSEQ_GROUP_ID,
        onApplied: (outcome, n) => m.catalogUpdates.inc({ outcome }, n),
      },
      runtime,
    );

    const copyRules = env.AUTOSEQ_LEARN_ENABLED && env.AUTOSEQ_RULES_SNAPSHOT_MS > 0;
    let guard: StateGuard | null = null;
    const epochKey = `${prefix}:aseq:epoch`;
    const restoring = restoreFlagKey(epochKey);
    const epoch = createEpoch(redis, epochKey, copyRules ? restoring : undefined);
    // Idle scopes leave the rules topic too (tombstoned by a sweep), not only Redis: see scope-retire.ts.
    const scopeTtl = env.AUTOSEQ_LEARN_SCOPE_TTL_MS;
    const timing = copyRules && scopeTtl > 0 ? retireTiming(scopeTtl) : null;
    // Retirement's two steps, for the sweep (TTL > 0) and for an operator's forget (`POST /rules/forget`, any TTL).
    const scopes: ScopeRetirement | null = env.AUTOSEQ_LEARN_ENABLED
      ? new ScopeRetirement({
          redis,
          prefix,
          sink,
          topic: env.AUTOSEQ_RULES_TOPIC,
          leaseMs: env.AUTOSEQ_LEARN_LEASE_MS,
          graceMs: timing?.graceMs ?? 0,
          log,
          paused: () => guard?.rebuilding() ?? true,
          ensureState: () => guard?.ensure() ?? Promise.resolve(),
          epoch: { key: epochKey, flag: restoring, value: () => epoch.current() },
          copies: copyRules,
          sweeps: timing !== null,
          maxRecordBytes: env.PAVER_MAX_OUTPUT_BYTES,
          onRetired: (outcome, n) => m.scopesRetired.inc({ outcome }, n),
          onRecords: (kind, n) => m.snapshot.records.inc({ kind }, n),
          recopy: (written) => snapshots.mark(written),
        })
      : null;
    const retirement = timing ? scopes : null;
    const snapshots = new RuleSnapshots({
      redis,
      prefix,
      sink,
      topic: env.AUTOSEQ_RULES_TOPIC,
      maxRecordBytes: env.PAVER_MAX_OUTPUT_BYTES,
      leaseMs: env.AUTOSEQ_LEARN_LEASE_MS,
      log,
      paused: () => guard?.rebuilding() ?? true,
      metrics: m.snapshot,
      register: retirement ? (scopes) => retirement.register(scopes) : undefined,
      // At any TTL: a copy that landed after a retirement's or a forget's tombstones is tombstoned again at once.
      requeue: scopes ? (written) => scopes.afterStaleCopy(written) : undefined,
    });
    // The active-rules gauge from what Redis holds, at start and after a restore (in the background).
    const seedActiveRules = () =>
      env.AUTOSEQ_LEARN_ENABLED
        ? seedActiveRulesGauge(redis, prefix, m.activeByScope, scopeTtl, timing?.graceMs ?? 0)
        : Promise.resolve();
    /**
     * Redis loss: the learned rules come back from the rules topic (the changes of the last copy interval
     * excepted); task states live minutes and start over. The guard makes the loss visible (a metric, a
     * warning, /readyz false until the rules are back). See README.
     */
    guard = createStateGuard({
      epoch,
      log,
      // A SIGTERM during a long restore ends it: the flag stays, and the next start restores again.
      goOn: isRunning,
      rebuild: async (reason, goOn) => {
        if (reason === 'lost') {
          m.stateLosses.inc();
          m.activeByScope.clear();
        }
        await restore(reason, goOn);
        seedActiveRules().catch((err: unknown) =>
          log.warn({ err: errorMessage(err) }, 'active rules not read from Redis; batches count them'),
        );
      },
    });
    async function restore(reason: 'start' | 'lost', goOn: () => boolean): Promise<void> {
      if (!copyRules) return;
      // At start, only a Redis whose marker was created with the flag (or a restore cut short) lost anything.
      if (reason === 'start' && !(await restoreCutShort(redis, restoring))) return;
      const r = await restoreRules(
        redis,
        prefix,
        restoring,
        replayOptions(runtime.kafka, env, env.AUTOSEQ_RULES_TOPIC, env.AUTOSEQ_GROUP_ID),
        goOn,
        scopeTtl,
        Date.now,
        retirement && timing ? { retirement, graceMs: timing.graceMs } : undefined,
      );
      m.restoredContexts.inc(r.contexts);
      if (r.forgotten > 0) m.scopesRetired.inc({ outcome: 'forgotten_at_restore' }, r.forgotten);
      log.info({ reason, ...r }, 'learned rules restored from the rules topic');
    }
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
              { key: epochKey, value: epoch.current() },
              // The sweep's grace: it retires the scope at the TTL, Redis's expiry is the backstop.
              scopeTtl + (timing?.graceMs ?? 0),
            )
        : null,
      taskKey: (ref) => taskKey(prefix, ref),
      opts: optionsFromEnv(env),
      lopts: learnOptions,
      sink,
      topic: env.PAVER_TOPIC_NEXT_ACTIONS,
      metrics: m,
      onLearned: copyRules ? (written) => snapshots.mark(written) : undefined,
    });

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      keyOf: (e) => e.session_id,
      extraTopics: [
        { topic: env.PAVER_TOPIC_TOOL_CATALOG, compacted: true },
        ...(copyRules ? [{ topic: env.AUTOSEQ_RULES_TOPIC, compacted: true }] : []),
      ],
      parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
      async start() {
        // Redis not reachable yet: the first batch (or /readyz probe) checks again; the guard logs failures.
        await guard.ensure().catch(() => undefined);
        // A stop during the restore ended it: the stop may have closed the feed already, which must not start now.
        if (!isRunning()) return;
        if (copyRules) snapshots.start(env.AUTOSEQ_RULES_SNAPSHOT_MS);
        if (retirement && timing) retirement.start(timing.sweepMs);
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
        await ensureHeartbeating(guard, ctx.heartbeat);
        return handle(batch, ctx);
      },
      routes: [
        // After a loss, the rules as the restore brings them back, not an empty Redis (as batches wait for it);
        // the read checks the marker the guard saw, in case the loss came between the two.
        rulesRoute(
          guardedScopeRead(
            () => guard.ensure(),
            (tenant, agent) =>
              readScope(redis, prefix, tenant, agent, { key: epochKey, value: epoch.current() }),
          ),
          learnOptions,
        ),
        ...(scopes
          ? [
              forgetRoute(async (tenant, agent) => {
                // After a loss, once the restore is done: one that read the topic before the tombstones would
                // write the scope back after them.
                await guard.ensure();
                const r = await scopes.forget(tenant, agent);
                m.activeByScope.delete(scopeId(tenant, agent));
                return r;
              }),
            ]
          : []),
      ],
      // After the consumer's last batch: its changes are copied before the producer goes.
      close: async () => {
        // The sweep first: a retirement it cut short marks contexts that the last copy then takes.
        await retirement?.stop();
        if (copyRules) await snapshots.stop();
        await feed.stop();
      },
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
