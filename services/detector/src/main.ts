import { zodParser } from '../../../shared/kafka/runner.js';
import { createEpoch } from '../../../shared/redis/epoch.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { TOOL_CALLS_EVENT_TYPES, toolCallsEventV1, type ToolCallsEvent } from '../../../schemas/index.js';
import { replayOptions } from '../../../shared/kafka/replay.js';
import { createBatchHandler } from './adapters/batch.js';
import { createCheckpointer } from './adapters/checkpointer.js';
import { candidatesRoute } from './adapters/http.js';
import { CheckpointLog } from './adapters/kafka/checkpoints.js';
import { createDetectorMetrics } from './adapters/metrics.js';
import { ScopePublisher } from './adapters/publisher.js';
import { Rebuilder } from './adapters/rebuild.js';
import { detectorGlobalKeys, RedisDetectorStore } from './adapters/redis/store.js';
import { createCommittedOffset, createPartitionReplay } from './adapters/replay.js';
import { createRestorePublished } from './adapters/restore-published.js';
import { detectorEnvSchema, paramsFromEnv, type DetectorEnv } from './config.js';

export const service: ServiceSpec<DetectorEnv, ToolCallsEvent> = {
  name: 'detector',
  envSchema: detectorEnvSchema,
  defaultPort: 9101,
  groupId: (env) => env.DETECTOR_GROUP_ID,
  async setup({ env, redis, sink, metrics, log, kafka, codec, partitions, isRunning }) {
    const params = paramsFromEnv(env);
    const store = new RedisDetectorStore(redis, params, env.REDIS_KEY_PREFIX);
    const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
    const m = createDetectorMetrics(metrics.registry, store);
    const replayOf = (topic: string) => replayOptions(kafka, env, topic, env.DETECTOR_GROUP_ID);
    const checkpoints = new CheckpointLog(
      sink,
      replayOf(env.DETECTOR_TOPIC_CHECKPOINTS),
      env.REDIS_KEY_PREFIX,
      env.PAVER_TOPIC_TOOL_CALLS,
    );
    const publisher = new ScopePublisher({
      store,
      sink,
      topic: env.PAVER_TOPIC_FLOW_CANDIDATES,
      params,
      log,
      onPublished: (status, n) => m.published.inc({ status }, n),
      onRecovered: (via) => m.recovered.inc({ via }),
      scopeTtlMs: env.DETECTOR_SCOPE_TTL_MS,
      sweepRebuiltOnly: true,
      onRetired: (outcome) => {
        m.retired.inc({ outcome });
        if (outcome === 'retired')
          log.info('idle scope retired: its candidates retracted, its state deleted');
      },
    });
    // A change whose instance died, in a scope that gets no more batches: found within a minute; and idle
    // scopes retired.
    publisher.sweepEvery(60_000);
    const rebuilder = new Rebuilder({
      store,
      restorePublished: createRestorePublished({
        candidates: replayOf(env.PAVER_TOPIC_FLOW_CANDIDATES),
        codec,
        store,
        scopeTtlMs: env.DETECTOR_SCOPE_TTL_MS,
        log,
      }),
      epoch: createEpoch(redis, detectorGlobalKeys(env.REDIS_KEY_PREFIX).epoch),
      checkpoints,
      replay: createPartitionReplay({
        input: replayOf(env.PAVER_TOPIC_TOOL_CALLS),
        codec,
        parse,
        maxBytes: env.PAVER_MAX_MESSAGE_BYTES,
        chunk: env.PAVER_BATCH_CHUNK,
        maxAheadMs: env.DETECTOR_MAX_AHEAD_MS,
        requestTerms: params.requestTerms,
        log,
      }),
      log,
      owned: {
        owned: () => {
          const a = partitions();
          return a === null ? null : (a[env.PAVER_TOPIC_TOOL_CALLS] ?? []);
        },
        committed: createCommittedOffset({
          kafka,
          groupId: env.DETECTOR_GROUP_ID,
          topic: env.PAVER_TOPIC_TOOL_CALLS,
        }),
        publish: async (scopes) => {
          const published = await Promise.allSettled(scopes.map((s) => publisher.publish(s, true)));
          for (const p of published) if (p.status === 'rejected') throw p.reason;
        },
        isRunning,
      },
      hooks: {
        started: () => m.rebuilding.inc(),
        finished: (_p, outcome, events) => {
          m.rebuilding.dec();
          m.rebuilds.inc({ outcome });
          m.replayed.inc(events);
        },
      },
    });
    // A loss seen by no batch (the partitions with traffic are another instance's, or there is none) is found here.
    rebuilder.rebuildOwnedEvery(60_000);

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      keyOf: (e) => e.session_id,
      parse,
      extraTopics: [{ topic: env.DETECTOR_TOPIC_CHECKPOINTS, compacted: true, partitions: 1 }],
      readiness: [{ name: 'detector_state', check: () => !rebuilder.isRebuilding() }],
      // At a join: the partitions owned now that are not rebuilt in this epoch (a start after a loss, say).
      onRebalance: () => void rebuilder.rebuildOwned(),
      close: async () => {
        await rebuilder.close();
        await publisher.close();
      },
      handler: createBatchHandler({
        store,
        rebuilder,
        publisher,
        checkpoint: createCheckpointer({
          store,
          checkpoints,
          intervalMs: env.DETECTOR_CHECKPOINT_INTERVAL_MS,
        }),
        requestTerms: params.requestTerms,
        maxAheadMs: env.DETECTOR_MAX_AHEAD_MS,
        metrics: m,
        log,
      }),
      routes: [candidatesRoute(store, params)],
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
