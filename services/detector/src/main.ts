import { decodeMessage } from '../../../shared/kafka/decode.js';
import { zodParser } from '../../../shared/kafka/runner.js';
import { createEpoch } from '../../../shared/redis/epoch.js';
import { PaverError } from '../../../shared/errors.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import {
  TOOL_CALLS_EVENT_TYPES,
  toolCallsEventV1,
  flowCandidateRecordV1,
  type ToolCallsEvent,
  id as idSchema,
} from '../../../schemas/index.js';
import { CheckpointLog } from './adapters/kafka/checkpoints.js';
import { readRanges, readToEnd, replayOptions } from '../../../shared/kafka/replay.js';
import { ScopePublisher } from './adapters/publisher.js';
import { Rebuilder, type PartitionReplay } from './adapters/rebuild.js';
import { detectorGlobalKeys, RedisDetectorStore } from './adapters/redis/store.js';
import { candidateKey } from './core/candidate.js';
import { liveCandidates } from './core/detect.js';
import { aheadOfRecord, scopeId, toOp, type DetectorOp, type Scope } from './core/ops.js';
import { IGNORE_REASONS } from './core/state.js';
import { createDetectorMetrics } from './adapters/metrics.js';
import { detectorEnvSchema, paramsFromEnv, type DetectorEnv } from './config.js';

export const service: ServiceSpec<DetectorEnv, ToolCallsEvent> = {
  name: 'detector',
  envSchema: detectorEnvSchema,
  defaultPort: 9101,
  groupId: (env) => env.DETECTOR_GROUP_ID,
  async setup({ env, redis, sink, metrics, log, kafka, codec }) {
    const params = paramsFromEnv(env);
    const store = new RedisDetectorStore(redis, params, env.REDIS_KEY_PREFIX);
    const parse = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
    const m = createDetectorMetrics(metrics.registry);
    const replayOf = (topic: string) => replayOptions(kafka, env, topic, env.DETECTOR_GROUP_ID);
    const checkpoints = new CheckpointLog(
      sink,
      replayOf(env.DETECTOR_TOPIC_CHECKPOINTS),
      env.REDIS_KEY_PREFIX,
      env.PAVER_TOPIC_TOOL_CALLS,
    );
    const input = replayOf(env.PAVER_TOPIC_TOOL_CALLS);
    const replayDecode = { codec, parse, maxBytes: env.PAVER_MAX_MESSAGE_BYTES };
    const replay: PartitionReplay = async (partition, from, end, each, goOn) => {
      const { lowWatermarks } = await readRanges(
        input,
        new Map([[partition, { from: from ?? 0n, end }]]),
        async (_p, messages) => {
          // Applied PAVER_BATCH_CHUNK messages at a time, as the live path applies them: a script call per scope
          // and chunk is what REDIS_COMMAND_TIMEOUT_MS is set to outlast, and a fetched batch may be far larger.
          for (let i = 0; i < messages.length; i += env.PAVER_BATCH_CHUNK) {
            const chunk = messages.slice(i, i + env.PAVER_BATCH_CHUNK);
            const ops: DetectorOp[] = [];
            for (const m of chunk) {
              if (m.value === null) continue;
              // Decoded as the live path decodes (size, depth, contract): what it dead-lettered made no state then
              // either. A registry that does not answer throws, and the rebuild is tried again; before, such a
              // message was skipped as if dead-lettered, and one the live path dead-lettered for its size or depth
              // was applied.
              const decoded = await decodeMessage(m, input.topic, replayDecode);
              if (!decoded.ok) continue;
              // Ignored when first read (counted then): ignored again, so the rebuilt state is the one it was.
              if (aheadOfRecord(decoded.value.ts, m.timestamp, env.DETECTOR_MAX_AHEAD_MS)) continue;
              const op = toOp(decoded.value, params.requestTerms, partition, m.offset);
              if (op) ops.push(op);
            }
            await each(ops, chunk.length);
          }
        },
        goOn,
      );
      const low = lowWatermarks.get(partition) ?? 0n;
      if (from !== null && from < low)
        log.error(
          { partition, checkpoint: from.toString(), lowWatermark: low.toString() },
          'rebuild replay starts after its checkpoint: the tool-calls topic no longer retains it (raise its retention); the oldest window records are missing',
        );
    };
    /** The candidates the topic still holds as active, per scope (the latest record per key wins). */
    const restorePublished = async (): Promise<Scope[]> => {
      const latest = new Map<string, { scope: Scope; key: string; active: boolean; at: number }>();
      // Each scope's latest stamp on the topic: flows holds records stamped so, and drops an older one as stale.
      const stamps = new Map<string, { scope: Scope; at: number }>();
      await readToEnd(replayOf(env.PAVER_TOPIC_FLOW_CANDIDATES), async (_p, messages) => {
        for (const m of messages) {
          if (m.value === null) continue;
          const rec = await codec.decode(m.value).then(
            (v) => flowCandidateRecordV1.safeParse(v),
            () => null,
          );
          if (!rec?.success) continue;
          const scope = { tenant: rec.data.tenant_id, agent: rec.data.agent_id };
          const sid = scopeId(scope);
          stamps.set(sid, { scope, at: Math.max(stamps.get(sid)?.at ?? 0, rec.data.detected_at) });
          // The newest by stamp, whatever the order partitions are read in: one candidate's records may sit
          // under two keys (a key format changed between versions), on two partitions.
          const k = candidateKey(scope, rec.data.dedupe_key);
          const prev = latest.get(k);
          if (prev && prev.at > rec.data.detected_at) continue;
          latest.set(k, {
            scope,
            key: rec.data.dedupe_key,
            active: rec.data.status === 'active',
            at: rec.data.detected_at,
          });
        }
      });
      const byScope = new Map<string, { scope: Scope; keys: string[] }>();
      for (const c of latest.values()) {
        if (!c.active) continue;
        const id = scopeId(c.scope);
        let g = byScope.get(id);
        if (!g) byScope.set(id, (g = { scope: c.scope, keys: [] }));
        g.keys.push(c.key);
      }
      // Retired scopes keep their retractions on the topic: their stamps come back expiring, as retirement left them.
      await store.restorePublished([...byScope.values()], [...stamps.values()], env.DETECTOR_SCOPE_TTL_MS);
      log.info({ scopes: byScope.size }, 'publication state restored from the flow-candidates topic');
      return [...byScope.values()].map((g) => g.scope);
    };
    const publisher = new ScopePublisher({
      store,
      sink,
      topic: env.PAVER_TOPIC_FLOW_CANDIDATES,
      params,
      log,
      onPublished: (status, n) => m.published.inc({ status }, n),
      onRecovered: (via) => m.recovered.inc({ via }),
      scopeTtlMs: env.DETECTOR_SCOPE_TTL_MS,
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
      restorePublished,
      epoch: createEpoch(redis, detectorGlobalKeys(env.REDIS_KEY_PREFIX).epoch),
      checkpoints,
      replay,
      log,
      hooks: {
        started: () => m.rebuilding.inc(),
        finished: (_p, outcome, events) => {
          m.rebuilding.dec();
          m.rebuilds.inc({ outcome });
          m.replayed.inc(events);
        },
      },
    });
    const lastCheckpoint = new Map<number, { at: number; offset: bigint }>();
    /** Throttled: an older checkpoint is always safe (a longer replay), never a wrong one. */
    const maybeCheckpoint = async (partition: number, next: bigint, epoch: string) => {
      const now = Date.now();
      const prev = lastCheckpoint.get(partition);
      if (prev && now - prev.at < env.DETECTOR_CHECKPOINT_INTERVAL_MS) return;
      const offset = await store.checkpoint(partition, next, epoch);
      // The state went after this batch: its next batch rebuilds, from the checkpoint as it stands.
      if (offset === null) return;
      if (prev?.offset !== offset) await checkpoints.write(partition, offset, now);
      lastCheckpoint.set(partition, { at: now, offset });
    };
    let tripsSeen = 0;
    const countTrips = () => {
      m.trips.inc(store.roundTrips - tripsSeen);
      tripsSeen = store.roundTrips;
    };

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      keyOf: (e) => e.session_id,
      parse,
      extraTopics: [{ topic: env.DETECTOR_TOPIC_CHECKPOINTS, compacted: true, partitions: 1 }],
      readiness: [{ name: 'detector_state', check: () => !rebuilder.isRebuilding() }],
      close: () => publisher.close(),
      async handler(batch, ctx) {
        const first = batch[0];
        if (!first) return;
        const partition = first.partition;
        let future = 0;
        const ops: DetectorOp[] = [];
        for (const b of batch) {
          if (aheadOfRecord(b.value.ts, b.timestamp, env.DETECTOR_MAX_AHEAD_MS)) {
            future++;
            continue;
          }
          const op = toOp(b.value, params.requestTerms, b.partition, b.offset);
          if (op) ops.push(op);
        }
        if (future > 0) {
          m.events.inc({ outcome: 'ignored' }, future);
          m.ignoredBy.inc({ reason: 'future' }, future);
          log.warn(
            { future, partition, topic: first.topic, maxAheadMs: env.DETECTOR_MAX_AHEAD_MS },
            'events ignored: their ts is further than DETECTOR_MAX_AHEAD_MS after their Kafka record was produced (a clock running ahead, or ts not in milliseconds)',
          );
        }
        const touched = new Map(ops.map((o) => [scopeId(o.scope), o.scope]));
        const toPublish = new Map<string, Scope>();
        let out: Awaited<ReturnType<typeof store.applyBatch>>;
        let epoch: string;
        for (let attempt = 1; ; attempt++) {
          // Everything before this chunk on its partition has been applied (by this process or an earlier
          // owner): that is where a rebuild's replay ends.
          const ready = await rebuilder.ensure(partition, BigInt(first.offset), [...touched.values()], ctx);
          for (const s of ready.changed) toPublish.set(scopeId(s), s);
          epoch = ready.epoch;
          out = await store.applyBatch(ops, { epoch });
          if (!out.lost) break;
          if (attempt >= 5)
            throw new PaverError(
              'REDIS_UNAVAILABLE',
              'detector state lost in Redis again after every rebuild',
            );
          if (!out.markerLost && !out.olderLayout && out.stale.length > 0) {
            // The partition was rebuilt in this epoch (ensure above), but these scopes were not: no rebuild had
            // an event of theirs to replay. Cleared as a rebuild would, then the batch is applied again.
            if (await store.clearStale(out.stale, epoch)) {
              log.warn(
                { partition, scopes: out.stale.length },
                'detector state of an earlier epoch that no rebuild reached (its events no longer on the tool-calls topic) cleared',
              );
              continue;
            }
          }
          if (out.olderLayout) {
            // Every scope's state holds every partition's part: all of them are rebuilt, under a new epoch.
            await store.retireEpoch(epoch);
            log.warn(
              { partition },
              'detector state of an older layout (written by an earlier version) found: a new Redis epoch rebuilds every partition from Kafka',
            );
          } else
            log.warn(
              { partition },
              'detector state lost in Redis during a batch: rebuilding before applying it',
            );
          rebuilder.invalidate(partition);
        }
        m.events.inc({ outcome: 'applied' }, out.applied);
        m.events.inc({ outcome: 'ignored' }, out.ignored);
        for (const reason of IGNORE_REASONS) m.ignoredBy.inc({ reason }, out.ignoredBy[reason]);
        // Never silent: late events are counted above and named here (counts only, never their contents).
        if (out.ignoredBy.late > 0)
          log.warn(
            { late: out.ignoredBy.late, partition: batch[0]?.partition, topic: batch[0]?.topic },
            'late events ignored (older than DETECTOR_TASK_IDLE_MS behind their partition, or after their task closed)',
          );
        if (out.ignoredBy.misrouted > 0)
          log.warn(
            { misrouted: out.ignoredBy.misrouted, partition: batch[0]?.partition, topic: batch[0]?.topic },
            'events of tasks open on another partition ignored (the tool-calls topic must be keyed by session_id)',
          );
        m.records.inc(out.completed);
        for (const s of out.changed) toPublish.set(scopeId(s), s);
        const owedOnly = out.owed.filter((s) => !toPublish.has(scopeId(s)));
        // Scopes publish independently (each under its own lock, to its own keys): their Redis and Kafka round
        // trips overlap instead of adding up. Every one has finished, written or failed, before the chunk counts
        // as handled; the first failure then fails it (and it is retried whole).
        const publications = await Promise.allSettled([
          ...[...toPublish.values()].map((scope) => publisher.publish(scope, true)),
          ...owedOnly.map((scope) => publisher.publish(scope, false)),
        ]);
        for (const p of publications) if (p.status === 'rejected') throw p.reason;
        await maybeCheckpoint(partition, BigInt(batch[batch.length - 1]!.offset) + 1n, epoch);
        countTrips();
      },
      routes: [
        {
          method: 'GET',
          path: '/candidates',
          query: ['tenant_id', 'agent_id'],
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
