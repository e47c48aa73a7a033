import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1, type ToolCallsEvent } from '../../../schemas/index.js';
import { PaverError, errorMessage } from '../../../shared/errors.js';
import { readConfigFile } from '../../../shared/jsonl.js';
import { replayOptions } from '../../../shared/kafka/replay.js';
import { zodParser } from '../../../shared/kafka/runner.js';
import { createEpoch, restoreFlagKey } from '../../../shared/redis/epoch.js';
import {
  createStateGuard,
  ensureHeartbeating,
  flaggedRestore,
  restoreCutShort,
} from '../../../shared/redis/rebuild.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { createBatchHandler } from './adapters/batch.js';
import { answerFromState } from './adapters/answer.js';
import { allowedToolsRoute } from './adapters/http.js';
import { createSequencerMetrics } from './adapters/metrics.js';
import { trackedEpochCheck } from './adapters/epoch.js';
import { copyToSessionLog, readSessionLog } from './adapters/kafka/session-log.js';
import { createOrchestrationFeed } from './adapters/orchestration-feed.js';
import { RedisSessionStore } from './adapters/redis/store.js';
import { StateCache } from './adapters/state-cache.js';
import { ConfigError, loadOrchestrationFile, Orchestrations } from './core/orchestration.js';
import { sequencerEnvSchema, type SequencerEnv } from './config.js';

async function initialOrchestrations(file: string | undefined): Promise<Orchestrations> {
  if (!file) return new Orchestrations();
  try {
    return loadOrchestrationFile(await readConfigFile(file));
  } catch (err) {
    const why = err instanceof ConfigError ? err.message : `cannot read ${file}: ${errorMessage(err)}`;
    throw new PaverError('CONFIG_INVALID', `SEQUENCER_CONFIG_FILE: ${why}`);
  }
}

export const service: ServiceSpec<SequencerEnv, ToolCallsEvent> = {
  name: 'sequencer',
  envSchema: sequencerEnvSchema,
  defaultPort: 9103,
  groupId: (env) => env.SEQUENCER_GROUP_ID,
  async setup({ env, redis, sink, metrics, log, runtime, isRunning }) {
    const config = await initialOrchestrations(env.SEQUENCER_CONFIG_FILE);
    const cache = new StateCache(
      env.SEQUENCER_STATE_CACHE_SIZE,
      // A cached state never outlives its Redis key.
      Math.min(env.SEQUENCER_STATE_CACHE_MAX_AGE_MS, env.SEQUENCER_SESSION_TTL_MS),
    );
    // The marker the guard last saw, checked after each batch's reads (`epoch` is made below, before any batch).
    const store = new RedisSessionStore(
      redis,
      env.REDIS_KEY_PREFIX,
      env.SEQUENCER_SESSION_TTL_MS,
      cache,
      () => (copying ? { key: epochKey, value: epoch.current() } : null),
    );
    const m = createSequencerMetrics(
      metrics.registry,
      () => config.size,
      () => cache.size,
      () => epoch.tracking(),
    );
    const feed = createOrchestrationFeed(
      config,
      {
        topic: env.PAVER_TOPIC_ORCHESTRATION,
        groupPrefix: env.SEQUENCER_GROUP_ID,
        onApplied: (outcome, n) => m.updates.inc({ outcome }, n),
      },
      runtime,
    );
    const copying = env.SEQUENCER_STATE_COPY_ENABLED;
    const stateTopic = env.SEQUENCER_STATE_TOPIC;
    const epochKey = `${env.REDIS_KEY_PREFIX}:seq:epoch`;
    const restoring = restoreFlagKey(epochKey);
    // Epoch checks on a connection of their own: every allowed-tools read checks the epoch (a state cached
    // before a Redis loss must not answer), and on the shared connection a GET waited behind whole batches'
    // session pipelines. Tracked, a check costs no command while Redis vouches for the marker.
    const epochRedis = redis.duplicate();
    epochRedis.on('error', (err: Error) => log.warn({ err: err.message }, 'redis connection error (epoch)'));
    const epoch = trackedEpochCheck(
      epochRedis,
      createEpoch(epochRedis, epochKey, copying ? restoring : undefined),
      { heartbeatMs: env.SEQUENCER_EPOCH_HEARTBEAT_MS, log },
    );
    /**
     * Redis loss: every batch copies the states it writes to the session topic before Redis, so the states
     * come back from it (each session as its last batch left it; reads and batches wait meanwhile). The cache
     * is forgotten either way. See README "Redis loss".
     */
    const guard = createStateGuard({
      epoch,
      log,
      // A SIGTERM during a long restore ends it: the flag stays, and the next start restores again.
      goOn: isRunning,
      rebuild: async (reason, goOn) => {
        cache.clear();
        if (reason === 'lost') m.stateLosses.inc();
        if (!copying) {
          if (reason === 'lost')
            log.warn('session states lost with redis: sessions start over at their next event');
          return;
        }
        // At start, only a Redis whose marker was created with the flag (or a restore cut short) lost anything.
        if (reason === 'start' && !(await restoreCutShort(redis, restoring))) return;
        const r = await flaggedRestore(redis, restoring, async () => {
          let expired = 0;
          let restored = 0;
          const { read, skipped } = await readSessionLog(
            replayOptions(runtime.kafka, env, stateTopic, env.SEQUENCER_GROUP_ID),
            env.REDIS_KEY_PREFIX,
            async (sessions) => {
              const now = Date.now();
              const live = sessions
                .map((s) => ({
                  ref: s.ref,
                  value: s.value,
                  ttlMs: s.at + env.SEQUENCER_SESSION_TTL_MS - now,
                }))
                .filter((s) => s.ttlMs > 0);
              expired += sessions.length - live.length;
              restored += await store.restore(live);
            },
            goOn,
          );
          return { read, expired, skipped, restored };
        });
        m.restored.inc(r.restored);
        log.info({ reason, ...r }, 'session states restored from the session topic');
      },
    });
    const handle = createBatchHandler({
      config,
      store,
      sink,
      topic: env.PAVER_TOPIC_SEQUENCE_STATE,
      metrics: m,
      copy: copying ? copyToSessionLog(sink, stateTopic, env.REDIS_KEY_PREFIX) : undefined,
    });
    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      keyOf: (e) => e.session_id,
      extraTopics: [
        { topic: env.PAVER_TOPIC_ORCHESTRATION, compacted: true },
        ...(copying
          ? [{ topic: stateTopic, compacted: true, retentionMs: env.SEQUENCER_SESSION_TTL_MS }]
          : []),
      ],
      parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
      async start() {
        // Redis not reachable yet: the first batch (or /readyz probe) checks again; failures are the guard's to log.
        await guard.ensure().catch(() => undefined);
        // A stop during the restore ended it: the stop may have closed the feed already, which must not start now.
        if (!isRunning()) return;
        await feed.start();
        if (await feed.caughtUp(env.SEQUENCER_CONFIG_WAIT_MS))
          log.info({ agents: config.size }, 'orchestration configuration loaded');
        else {
          log.warn('orchestration topic not caught up yet; consumption waits for it, /readyz says so');
          // Said again while it lasts: a consumer paused for good must not look like a quiet topic.
          const nag = setInterval(() => {
            if (feed.isCaughtUp()) {
              clearInterval(nag);
              log.info({ agents: config.size }, 'orchestration configuration loaded; consuming');
            } else log.warn('still waiting for the orchestration topic to be read to its end');
          }, 30_000).unref();
        }
      },
      // An event judged without its agent's configuration would be published with no tool allowed and move the
      // session on (its position advances, so no redelivery repairs it): events wait for the table instead.
      consumeWhen: () => feed.isCaughtUp(),
      readiness: [
        { name: 'orchestration', check: () => feed.isCaughtUp() },
        { name: 'redis_state', check: () => guard.ready() },
      ],
      // Sessions whose partition moves are written by their new owner from now on: what this instance cached
      // of them would answer stale (up to the cache's max age). Every entry goes; the next read refills it.
      onRebalance: () => cache.clear(),
      async handler(batch, ctx) {
        // A session loaded from a Redis that lost it starts over; a loss is noticed (and counted) first.
        await ensureHeartbeating(guard, ctx.heartbeat);
        return handle(batch, ctx);
      },
      routes: [
        allowedToolsRoute(
          config,
          answerFromState({
            ensure: () => guard.ensure(),
            rebuilding: () => guard.rebuilding(),
            cache,
            store,
            onRead: (source) => m.stateReads.inc({ source }),
          }),
          // Reads wait for the table as consumption does (SEQUENCER_CONFIG_WAIT_MS only ends start-up's wait).
          () => feed.isCaughtUp(),
        ),
      ],
      close: async () => {
        await feed.stop();
        epoch.close();
        epochRedis.disconnect();
      },
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
