import { Counter } from 'prom-client';
import { zodParser } from '../../../shared/kafka/runner.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import {
  TOOL_CALLS_EVENT_TYPES,
  toolCallsEventV1,
  type ToolCallsEvent,
  id as idSchema,
} from '../../../schemas/index.js';
import { publishScope } from './adapters/publisher.js';
import { RedisDetectorStore } from './adapters/redis/store.js';
import { liveCandidates } from './core/detect.js';
import { toOp, type DetectorOp, type Scope } from './core/ops.js';
import { IGNORE_REASONS } from './core/state.js';
import { detectorEnvSchema, paramsFromEnv, type DetectorEnv } from './config.js';

export const service: ServiceSpec<DetectorEnv, ToolCallsEvent> = {
  name: 'detector',
  envSchema: detectorEnvSchema,
  defaultPort: 9101,
  groupId: (env) => env.DETECTOR_GROUP_ID,
  async setup({ env, redis, sink, metrics, log }) {
    const params = paramsFromEnv(env);
    const store = new RedisDetectorStore(redis, params, env.REDIS_KEY_PREFIX);
    const r = [metrics.registry];
    const events = new Counter({
      name: 'paver_detector_events_total',
      help: 'Detector events by outcome (applied, ignored: see paver_detector_events_ignored_total).',
      labelNames: ['outcome'],
      registers: r,
    });
    const ignoredBy = new Counter({
      name: 'paver_detector_events_ignored_total',
      help: 'Events the detector did not use, by reason: duplicate (redelivered), late (for a closed task, or older than the task idle limit behind its partition), task_limit.',
      labelNames: ['reason'],
      registers: r,
    });
    for (const reason of IGNORE_REASONS) ignoredBy.inc({ reason }, 0);
    const records = new Counter({
      name: 'paver_detector_records_completed_total',
      help: 'Task records completed and entered into the window.',
      registers: r,
    });
    const published = new Counter({
      name: 'paver_detector_candidates_published_total',
      help: 'Candidate records published, by status.',
      labelNames: ['status'],
      registers: r,
    });
    const trips = new Counter({
      name: 'paver_detector_redis_round_trips_total',
      help: 'Redis round trips made by the detector.',
      registers: r,
    });
    let tripsSeen = 0;
    const countTrips = () => {
      trips.inc(store.roundTrips - tripsSeen);
      tripsSeen = store.roundTrips;
    };

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
      async handler(batch) {
        const ops = batch
          .map((b) => toOp(b.value, params.requestTerms, b.partition))
          .filter((o): o is DetectorOp => o !== null);
        const out = await store.applyBatch(ops);
        events.inc({ outcome: 'applied' }, out.applied);
        events.inc({ outcome: 'ignored' }, out.ignored);
        for (const reason of IGNORE_REASONS) ignoredBy.inc({ reason }, out.ignoredBy[reason]);
        // Never silent: late events are counted above and named here (counts only, never their contents).
        if (out.ignoredBy.late > 0)
          log.warn(
            { late: out.ignoredBy.late, partition: batch[0]?.partition, topic: batch[0]?.topic },
            'late events ignored (older than DETECTOR_TASK_IDLE_MS behind their partition, or after their task closed)',
          );
        records.inc(out.completed);
        for (const scope of out.changed) {
          await publishScope(store, sink, env.PAVER_TOPIC_FLOW_CANDIDATES, params, scope, (status, n) =>
            published.inc({ status }, n),
          );
        }
        countTrips();
      },
      routes: [
        {
          method: 'GET',
          path: '/candidates',
          async handler(req) {
            const scope: Scope = {
              tenant: req.query.get('tenant_id') ?? 'default',
              agent: req.query.get('agent_id') ?? 'default',
            };
            if (!idSchema.safeParse(scope.tenant).success || !idSchema.safeParse(scope.agent).success) {
              return {
                status: 400,
                body: { error: 'tenant_id and agent_id must be 1-256 characters without control characters' },
              };
            }
            const snap = await store.snapshot(scope);
            return { status: 200, body: liveCandidates(snap.stats, params, snap.records) };
          },
        },
      ],
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
