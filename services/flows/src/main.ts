import { flowsFileV1 } from '../../../schemas/index.js';
import { createEpoch } from '../../../shared/redis/epoch.js';
import { createStateGuard, ensureHeartbeating } from '../../../shared/redis/rebuild.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { FlowsEngine, type Inbound } from './adapters/engine.js';
import { loadFile } from './adapters/files.js';
import { flowsTopicWriter } from './adapters/flows-topic.js';
import { flowRoutes, selectOnDemand } from './adapters/http.js';
import { inboundParser } from './adapters/inbound.js';
import { syncManualFlows } from './adapters/manual-flows.js';
import { createFlowsMetrics } from './adapters/metrics.js';
import { createRebuild } from './adapters/rebuild.js';
import { RedisFlowStore } from './adapters/redis/store.js';
import { createRegistryFeed } from './adapters/registry-feed.js';
import { CandidateStates, createStateFeed, stateWriter } from './adapters/state-feed.js';
import type { SelectorDeps } from './adapters/selector.js';
import { startTimers, vectorRefresher, type Timers } from './adapters/timers.js';
import { OutcomeBook } from './core/outcomes.js';
import { PromptCache } from './core/prompt.js';
import { FlowRegistry } from './core/registry.js';
import { flowsEnvSchema, policies, readPolicyFile, stateTopicOf, type FlowsEnv } from './config.js';

export const service: ServiceSpec<FlowsEnv, Inbound> = {
  name: 'flows',
  envSchema: flowsEnvSchema,
  defaultPort: 9104,
  groupId: (env) => env.FLOWS_GROUP_ID,
  async setup({ env, redis, sink, metrics, log, runtime, isRunning }) {
    const manualFile = env.FLOWS_FILE ? await loadFile(env.FLOWS_FILE, flowsFileV1, 'FLOWS_FILE') : [];
    const manual = Array.isArray(manualFile) ? manualFile : manualFile.flows;
    const policy = policies(env, await readPolicyFile(env));

    const registry = new FlowRegistry();
    const prompts = new PromptCache();
    const stateTopic = stateTopicOf(env);
    const states = new CandidateStates();
    const store = new RedisFlowStore(redis, env.REDIS_KEY_PREFIX, stateWriter(sink, stateTopic, states));
    const m = createFlowsMetrics(metrics.registry, {
      shadowPool: () => engine.shadow.size,
      registered: () => registry.size,
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
    const outcomes = new OutcomeBook(policy.outcome());
    const selector: SelectorDeps & { outcomes: OutcomeBook } = {
      registry,
      prompts,
      chat: chatCfg,
      embeddings: embCfg,
      budgetMs: env.FLOWS_SELECT_BUDGET_MS,
      onModel: (o) => m.modelCalls.inc({ outcome: o }),
      outcomes,
    };
    const feed = createRegistryFeed(
      registry,
      prompts,
      {
        topic: env.PAVER_TOPIC_FLOWS,
        groupPrefix: env.FLOWS_GROUP_ID,
      },
      runtime,
    );
    const { publish: publishFlows, withdraw: withdrawFlows } = flowsTopicWriter(sink, env.PAVER_TOPIC_FLOWS);
    const engine = new FlowsEngine({
      store,
      publishFlows,
      withdrawFlows,
      onContention: () => m.contention.inc(),
      selector,
      promotionPolicy: policy.promotion,
      selectPolicy: policy.select,
      now: Date.now,
      onDecision: (status) => m.decisions.inc({ status }),
      onSelection: (path) => m.selections.inc({ path }),
      onUnpromotable: (tenant, agent, key, why) => {
        m.unpromotable.inc();
        log.warn({ tenant, agent, dedupe_key: key, why }, 'promotion refused: the flow would break flows.v1');
      },
      onShadow: () => m.shadowTrials.inc(),
      evidenceRuns: env.FLOWS_EVIDENCE_RUNS,
      evidenceMaxChars: env.FLOWS_EVIDENCE_MAX_CHARS,
      sessions: {
        load: (refs) => store.loadSessions(refs),
        save: (open, ended) => store.saveSessions(open, ended, env.FLOWS_SESSION_TTL_MS),
      },
      runs: {
        load: (t, a) => store.loadRuns(t, a),
        append: (t, a, run, mark) =>
          store.appendRun(t, a, run, outcomeCapacity, mark, env.FLOWS_SESSION_TTL_MS),
      },
    });

    let timers: Timers | null = null;
    const refreshVectors = embCfg
      ? vectorRefresher(registry, embCfg, env.FLOWS_SELECT_BUDGET_MS * 5, log)
      : undefined;

    // Other instances' decisions reach this instance's shadow pool as they are made, not only at its next start.
    const stateFeed = createStateFeed(
      states,
      {
        topic: stateTopic,
        groupPrefix: env.FLOWS_GROUP_ID,
      },
      runtime,
      (t, a, c) => engine.shadowState(t, a, c),
    );
    const outcomeCapacity = policy.outcome().capacity;
    const rebuild = createRebuild({
      store,
      outcomes,
      outcomeCapacity,
      stateFeed,
      states,
      feed,
      registry,
      waitMs: env.FLOWS_REGISTRY_WAIT_MS,
      log,
    });
    const guard = createStateGuard({
      epoch: createEpoch(redis, `${env.REDIS_KEY_PREFIX}:flows:epoch`),
      log,
      rebuild,
      goOn: isRunning,
      onRebuild: (reason, outcome) => m.rebuilds.inc({ reason, outcome }),
    });

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS, env.PAVER_TOPIC_FLOW_CANDIDATES],
      keyOf: (v) => (v.kind === 'event' ? v.e.session_id : null),
      extraTopics: [
        { topic: env.PAVER_TOPIC_FLOWS, compacted: true },
        { topic: stateTopic, compacted: true },
      ],
      parse: inboundParser(env.PAVER_TOPIC_FLOW_CANDIDATES),
      async start() {
        await Promise.all([feed.start(), stateFeed.start()]);
        const loaded = await feed.caughtUp(env.FLOWS_REGISTRY_WAIT_MS);
        // A stop ends the wait (the feed's stop): start-up ends there too, or a service being closed would go on
        // to publish the hand-written flows to the flows topic.
        if (!isRunning()) return;
        if (loaded) log.info({ flows: registry.size }, 'flow registry loaded');
        else log.warn('flows topic not caught up yet; consuming anyway, /readyz says so');
        if (env.FLOWS_FILE)
          await syncManualFlows(manual, loaded, {
            registry,
            publishFlows,
            withdrawFlows,
            onWithdrawn: (n) => m.manualWithdrawn.inc(n),
            log,
            now: Date.now,
          });
        // The first use always rebuilds (idempotent): a process that died mid-rebuild left the marker behind.
        await guard.ensure().catch(() => {
          // Logged by the guard; still owed, so the first batch retries it and /readyz stays false till then.
        });
        // A stop during the restore ended it: the stop may have passed its close() already, which clears timers
        // that did not exist yet; those set now would run on closed clients (as in the sequencer and autoseq).
        if (!isRunning()) return;
        await refreshVectors?.();
        // Asked again, with no await between it and the timers: the stop may have come during the embeddings.
        if (!isRunning()) return;
        timers = startTimers({
          engine,
          guard,
          feed,
          registry,
          refreshVectors,
          reconcileMs: env.FLOWS_RECONCILE_MS,
          reconcileMinAgeMs: env.FLOWS_RECONCILE_MIN_AGE_MS,
          onOrphans: (n) => m.orphans.inc(n),
          log,
        });
      },
      // Sessions may move to another instance: this one reads them back from Redis if they come back.
      onRebalance: () => engine.forgetSessions(),
      readiness: [
        { name: 'flow_registry', check: () => feed.isCaughtUp() },
        { name: 'redis_state', check: () => guard.ready() },
      ],
      async handler(batch, ctx) {
        // Decisions read and write the candidates' states: never against a Redis that lost them.
        await ensureHeartbeating(guard, ctx.heartbeat);
        const out = await engine.handle(
          batch.map((m) =>
            m.value.kind === 'event' ? { ...m.value, partition: m.partition, offset: m.offset } : m.value,
          ),
          ctx.signal,
        );
        await sink.send(
          env.PAVER_TOPIC_FLOW_SELECTIONS,
          'flow-selections.v1',
          out.map((v) => ({ key: v.session_id, value: v })),
        );
      },
      routes: flowRoutes({
        store,
        registry,
        decide: (t, a, key, to) => engine.decide(t, a, key, to),
        select: selectOnDemand({
          selector,
          policy: (t, a) => policy.select(t, a),
          ensureRuns: (t, a) => engine.ensureRuns(t, a),
          onSelection: (path) => m.selections.inc({ path }),
          log,
        }),
        // Candidates live in Redis: never read or decide them in a Redis that lost them (selection does not need it).
        ensureState: () => guard.ensure(),
      }),
      close: async () => {
        await timers?.stop();
        await Promise.all([feed.stop(), stateFeed.stop()]);
      },
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
