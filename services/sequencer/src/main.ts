import { Counter, Gauge } from 'prom-client';
import {
  orchestrationRecordV1,
  TOOL_CALLS_EVENT_TYPES,
  toolCallsEventV1,
  toolName,
  id as idSchema,
  type OrchestrationRecord,
  type SequenceStateRecord,
  type ToolCallsEvent,
} from '../../../schemas/index.js';
import { PaverError, errorMessage } from '../../../shared/errors.js';
import { readConfigFile } from '../../../shared/jsonl.js';
import { zodParser } from '../../../shared/kafka/runner.js';
import { createTableFeed, TableRejection } from '../../../shared/kafka/table-feed.js';
import { runService, type ServiceSpec } from '../../../shared/service.js';
import { RedisSessionStore, type SessionRef, type Loaded } from './adapters/redis/store.js';
import { ConfigError, loadOrchestrationFile, Orchestrations } from './core/config.js';
import { applyEvent, settle, view, type SessionState } from './core/session.js';
import { sequencerEnvSchema, type SequencerEnv } from './config.js';

type FeedRecord = OrchestrationRecord | { kind: 'tombstone'; key: string | null };

/** `tenant/agent` (URI-encoded parts) → the scope; null for anything else. */
export function parseAgentKey(key: string | null): { tenant: string; agent: string } | null {
  const parts = key?.split('/');
  if (parts?.length !== 2) return null;
  try {
    return { tenant: decodeURIComponent(parts[0]!), agent: decodeURIComponent(parts[1]!) };
  } catch {
    return null;
  }
}

export const service: ServiceSpec<SequencerEnv, ToolCallsEvent> = {
  name: 'sequencer',
  envSchema: sequencerEnvSchema,
  defaultPort: 9103,
  groupId: (env) => env.SEQUENCER_GROUP_ID,
  async setup({ env, redis, kafka, codec, sink, metrics, log, fatal }) {
    let config = new Orchestrations();
    if (env.SEQUENCER_CONFIG_FILE) {
      try {
        config = loadOrchestrationFile(await readConfigFile(env.SEQUENCER_CONFIG_FILE));
      } catch (err) {
        const why =
          err instanceof ConfigError
            ? err.message
            : `cannot read ${env.SEQUENCER_CONFIG_FILE}: ${errorMessage(err)}`;
        throw new PaverError('CONFIG_INVALID', `SEQUENCER_CONFIG_FILE: ${why}`);
      }
    }
    const store = new RedisSessionStore(redis, env.REDIS_KEY_PREFIX, env.SEQUENCER_SESSION_TTL_MS);
    const r = [metrics.registry];
    const states = new Counter({
      name: 'paver_sequencer_states_published_total',
      help: 'Sequence-state records published.',
      registers: r,
    });
    const violations = new Counter({
      name: 'paver_sequencer_violations_total',
      help: 'Sequence violations, by policy.',
      labelNames: ['policy'],
      registers: r,
    });
    const duplicates = new Counter({
      name: 'paver_sequencer_redelivered_events_total',
      help: 'Events already applied (redelivery), ignored.',
      registers: r,
    });
    const updates = new Counter({
      name: 'paver_sequencer_config_updates_total',
      help: 'Orchestration topic records, by outcome (rejected ones are dead-lettered).',
      labelNames: ['outcome'],
      registers: r,
    });
    new Gauge({
      name: 'paver_sequencer_agents_configured',
      help: 'Agents with an orchestration in force.',
      registers: r,
      collect() {
        this.set(config.size);
      },
    });

    const feed = createTableFeed<FeedRecord>({
      service: 'sequencer',
      topic: env.PAVER_TOPIC_ORCHESTRATION,
      groupPrefix: env.SEQUENCER_GROUP_ID,
      parse: zodParser(orchestrationRecordV1),
      tombstone: (key) => ({ kind: 'tombstone', key }),
      apply(v, key) {
        if ('kind' in v) {
          const scope = parseAgentKey(v.key);
          if (!scope) throw new TableRejection('tombstone key must be tenant_id/agent_id');
          return config.delete(scope.tenant, scope.agent);
        }
        const scope = parseAgentKey(key);
        if (scope && (scope.tenant !== v.tenant_id || scope.agent !== v.agent_id))
          throw new TableRejection(`key '${key}' does not match the record's tenant_id/agent_id`);
        try {
          config.set(v);
        } catch (err) {
          throw err instanceof ConfigError ? new TableRejection(err.message) : err;
        }
      },
      env,
      kafka,
      codec,
      sink,
      metrics,
      log,
      onFatal: fatal,
      onApplied: (outcome, n) => updates.inc({ outcome }, n),
    });

    return {
      inputTopics: [env.PAVER_TOPIC_TOOL_CALLS],
      extraTopics: [{ topic: env.PAVER_TOPIC_ORCHESTRATION, compacted: true }],
      parse: zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES),
      async start() {
        await feed.start();
        if (await feed.caughtUp(env.SEQUENCER_CONFIG_WAIT_MS))
          log.info({ agents: config.size }, 'orchestration configuration loaded');
        else log.warn('orchestration topic not caught up yet; consuming anyway, /readyz says so');
      },
      readiness: [{ name: 'orchestration', check: () => feed.isCaughtUp() }],
      async handler(batch) {
        const refs = new Map<string, SessionRef>();
        const idOf = (e: ToolCallsEvent) => `${e.tenant_id}\u001f${e.agent_id}\u001f${e.session_id}`;
        for (const { value: e } of batch)
          refs.set(idOf(e), { tenant: e.tenant_id, agent: e.agent_id, session: e.session_id });
        const loaded = await store.load(refs);
        const current = new Map<string, SessionState>();
        const out: SequenceStateRecord[] = [];
        for (const rec of batch) {
          const e = rec.value;
          const id = idOf(e);
          const prev = current.get(id) ?? loaded.get(id)!.state;
          const o = applyEvent(config.get(e.tenant_id, e.agent_id), prev, e, {
            partition: rec.partition,
            offset: rec.offset,
          });
          if (o.duplicate) {
            duplicates.inc();
            continue;
          }
          current.set(id, o.state);
          if (o.record) out.push(o.record);
        }
        // Publish, then store: a crash in between re-applies the same events to the same records.
        await sink.send(
          env.PAVER_TOPIC_SEQUENCE_STATE,
          'sequence-state.v1',
          out.map((v) => ({ key: v.session_id, value: v })),
        );
        await store.save(
          [...current].map(([id, state]) => ({
            ref: refs.get(id)!,
            state,
            version: (loaded.get(id) as Loaded).version,
          })),
        );
        states.inc(out.length);
        for (const v of out) if (v.violation) violations.inc({ policy: v.violation.policy });
      },
      routes: [
        {
          method: 'GET',
          path: '/sessions/:session_id/allowed-tools',
          async handler(req) {
            const ref = {
              tenant: req.query.get('tenant_id') ?? 'default',
              agent: req.query.get('agent_id') ?? 'default',
              session: req.params.session_id ?? '',
            };
            if (![ref.tenant, ref.agent, ref.session].every((x) => idSchema.safeParse(x).success)) {
              return {
                status: 400,
                body: {
                  error:
                    'session_id, tenant_id and agent_id must be 1-256 characters without control characters',
                },
              };
            }
            const toolsParam = req.query.get('tools');
            const tools =
              toolsParam === null
                ? null
                : toolsParam
                    .split(',')
                    .map((t) => t.trim())
                    .filter(Boolean);
            if (tools && (tools.length > 10_000 || !tools.every((t) => toolName.safeParse(t).success)))
              return { status: 400, body: { error: 'tools must be a comma-separated list of tool names' } };
            const agent = config.get(ref.tenant, ref.agent);
            const state = { ...(await store.loadOne(ref)) };
            // The step the next event would be processed in: a session never seen is in the step the rule picks
            // for an empty session (the default step, if any); a finished sequence gives way to the rule's pick.
            if (agent) settle(agent, state);
            return {
              status: 200,
              body: { session_id: ref.session, ...view(agent, state, tools ?? agent?.tools ?? []) },
            };
          },
        },
      ],
      close: () => feed.stop(),
    };
  },
};

export const run = (env: NodeJS.ProcessEnv): Promise<number> => runService(service, env);
