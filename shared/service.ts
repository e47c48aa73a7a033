import type { Kafka } from 'kafkajs';
import type { Redis } from 'ioredis';
import type { z } from 'zod';
import { createCodec, type Codec } from './codec.js';
import { EXIT_CONFIG, misspeltVariables, parseEnv, type CommonEnv } from './config.js';
import { PaverError } from './errors.js';
import { withRetry } from './retry.js';
import { createHttpServer, type ReadinessCheck, type ReadinessResult, type Route } from './http.js';
import { createKafka } from './kafka/client.js';
import { createRunner, type BatchHandler, type Parser, type RuntimeDeps } from './kafka/runner.js';
import { createSink, type Sink } from './kafka/sink.js';
import { compactionProblems, ensureTopics, paverTopics, type TopicSpec } from './kafka/topics.js';
import { createLogger, type Logger } from './log.js';
import { createMetrics, type RuntimeMetrics } from './metrics.js';
import {
  createRedis,
  createRedisWatch,
  checkEviction,
  createRoleProbe,
  redisReady,
  type RedisRole,
} from './redis/client.js';
import { errorMessage, redisCommandTimedOut } from './errors.js';
import { createRegistryWatch } from './registry-watch.js';
import { watchProcessFaults } from './process-faults.js';

export interface ServiceDeps<E extends CommonEnv> {
  env: E;
  log: Logger;
  metrics: RuntimeMetrics;
  redis: Redis;
  kafka: Kafka;
  sink: Sink;
  codec: Codec;
  /** Stops the process with exit 1: for a service's own consumers that crash for good. */
  fatal: (err: Error) => void;
  /**
   * False from the moment the service begins to stop (a signal, a fatal error): for long work that no batch
   * context bounds, such as a restore of Redis from Kafka, which must give up then rather than hold the stop.
   */
  isRunning: () => boolean;
  /**
   * The main consumer's partitions per topic while it is in its group; null before it joins, from a rebalance's
   * start until it joins again, and once it stops (Runner.owned). `onRebalance` says when it may have changed.
   */
  partitions: () => Record<string, number[]> | null;
  /** The same dependencies as one object, to pass whole to `createTableFeed(spec, runtime)` and `createRunner`. */
  runtime: RuntimeDeps;
}

export interface ServiceParts<T> {
  inputTopics: string[];
  parse: Parser<T>;
  handler: BatchHandler<T>;
  /**
   * Inputs are consumed only while this holds (besides Redis being reachable): what the handler must not run
   * without, such as a configuration table read to its end. Consumption pauses meanwhile, /readyz says why.
   */
  consumeWhen?: () => boolean;
  /**
   * What the consumer decodes input values with before `parse`; by default the configured Paver codec (JSON
   * or Confluent framing). A service whose input is another format (OTLP, say) passes bytes through here.
   * Outputs always use the configured codec.
   */
  inputCodec?: Codec;
  routes?: Route[];
  extraTopics?: TopicSpec[];
  /** Runs after the topics exist and before the main consumer starts (load a catalog from its topic, say). */
  start?: () => Promise<void>;
  /** Readiness beyond Kafka and Redis (a catalog loaded, say). */
  readiness?: ReadinessCheck[];
  /** The main consumer's group is rebalancing, or this member joined it again (see RunnerSpec.onRebalance). */
  onRebalance?: () => void;
  /** The record key an input's contract asks for (see RunnerSpec.keyOf). */
  keyOf?: (value: T, topic: string) => string | null;
  close?: () => Promise<void>;
}

export interface ServiceSpec<E extends CommonEnv, T> {
  name: string;
  envSchema: z.ZodType<E>;
  /** The service's HTTP port when HTTP_PORT is unset. */
  defaultPort: number;
  groupId: (env: E) => string;
  setup: (deps: ServiceDeps<E>) => Promise<ServiceParts<T>>;
}

/**
 * Creates the missing topics when `create` (and waits for their leaders), or else refuses the start when one is
 * missing (CONFIG_INVALID, exit 78), then checks that those marked
 * `compacted` can keep each key's latest record (`compactionProblem`), whether Paver created them or the
 * operator did (`KAFKA_CREATE_TOPICS=false`): a state copy that expires is a Redis-loss restore that silently
 * brings back less, so such a topic refuses the start (CONFIG_INVALID, exit 78). One admin session, retried
 * a bounded number of times: a broker that has just started (several services creating topics at once)
 * answers "does not host this topic-partition" for a moment, and kafkajs reports its exhausted retries as
 * non-retriable. A broker that refuses this client DescribeConfigs (an authorization error) gets a warning and
 * the start goes on: the check guards, it is not a requirement. Resolves to the topics it created.
 */
async function prepareTopics(
  kafka: Kafka,
  specs: TopicSpec[],
  env: CommonEnv,
  log: Logger,
  create: boolean,
): Promise<string[]> {
  const { created, problems } = await withRetry(
    async () => {
      const admin = kafka.admin();
      try {
        await admin.connect();
        const created = create
          ? await ensureTopics(admin, specs, {
              partitions: env.KAFKA_TOPIC_PARTITIONS,
              replicationFactor: env.KAFKA_REPLICATION_FACTOR,
            })
          : [];
        const problems: string[] = [];
        // Not created, so checked: a missing topic the service writes (its dead letters, its outputs) was
        // found only at the first write, after the service had said it was ready; each batch then failed and
        // held its partition, restart after restart, until the process gave up.
        if (!create) {
          const existing = new Set(await admin.listTopics());
          const missing = specs.filter((s) => !existing.has(s.topic)).map((s) => s.topic);
          if (missing.length > 0)
            problems.push(
              `KAFKA_CREATE_TOPICS=false and these topics do not exist: ${missing.join(', ')} ` +
                '(create them, or set KAFKA_CREATE_TOPICS=true)',
            );
        }
        try {
          problems.push(...(await compactionProblems(admin, specs, (w) => log.warn(w))));
        } catch (err) {
          if (!authorizationRefused(err)) throw err;
          log.warn(
            { err: errorMessage(err) },
            "not allowed to read the topics' cleanup policies: not checked",
          );
        }
        return { created, problems };
      } catch (err) {
        throw new PaverError('KAFKA_UNAVAILABLE', `topic preparation failed: ${errorMessage(err)}`, {
          cause: err,
        });
      } finally {
        await admin.disconnect().catch(() => undefined);
      }
    },
    {
      attempts: 6,
      initialMs: 500,
      maxMs: 5_000,
      // Services started together create the same topics: for a moment the broker answers "does not host this
      // topic-partition" for one another's, and one retry cures it. A first retry is routine; a second says more.
      onRetry: (err, attempt, waitMs) =>
        log[attempt > 1 ? 'warn' : 'info'](
          { err: err.message, attempt, waitMs },
          'topics not ready; retrying',
        ),
    },
  );
  if (problems.length > 0) throw new PaverError('CONFIG_INVALID', problems.join('; '));
  return created;
}

/**
 * A broker's answer that this client may not do what it asked: kafkajs keeps the protocol's error type
 * (`TOPIC_AUTHORIZATION_FAILED`, `CLUSTER_AUTHORIZATION_FAILED`…), on the error or on the one it wraps.
 */
export function authorizationRefused(err: unknown): boolean {
  for (let e = err as { type?: unknown; cause?: unknown } | null | undefined, i = 0; e && i < 4; i++) {
    if (/AUTHORIZATION_FAILED/.test(String(e.type ?? ''))) return true;
    e = e.cause as typeof e;
  }
  return /authorization failed|not authorized/i.test(errorMessage(err));
}

/**
 * Wiring shared by every service: config → Redis/Kafka → topics → HTTP → consumer runner, and a graceful
 * stop on SIGTERM/SIGINT (finish the chunk in hand, commit, disconnect, exit 0). An unhandled rejection or an
 * uncaught exception starts the same stop, then exit 1; a second one during it exits 1 at once. Resolves to
 * the exit code.
 */
export async function runService<E extends CommonEnv, T>(
  spec: ServiceSpec<E, T>,
  rawEnv = process.env,
): Promise<number> {
  let env: E;
  try {
    env = parseEnv(spec.envSchema, rawEnv);
  } catch (err) {
    process.stderr.write(`paver ${spec.name}: ${errorMessage(err)}\n`);
    return EXIT_CONFIG;
  }
  const log = createLogger(spec.name, env.LOG_LEVEL);
  // Names only, never values: a misspelt password variable is still a password.
  for (const m of misspeltVariables(spec.envSchema, rawEnv))
    log.warn(m, `${m.variable} is not a variable this service reads (${m.meant} keeps its value): misspelt?`);
  const metrics = createMetrics(spec.name);
  const codec = createCodec(env);
  const kafka = createKafka(env, log, `${env.KAFKA_CLIENT_ID}-${spec.name}`);
  // A READONLY reply marks the server a replica for the runner (see createRedisWatch; made below, before any
  // command can be answered).
  const redis = createRedis(env, log, {}, { readOnly: () => redisWatch.note('replica') });
  // One role query at a time, for /readyz and the replica watch: while Redis hangs, probes must not pile up
  // commands in its queue.
  const redisRole = createRoleProbe(redis, log);
  let asking: Promise<RedisRole> | null = null;
  const roleOnce = () => (asking ??= redisRole().finally(() => (asking = null)));
  const redisWatch = createRedisWatch(roleOnce, log);
  const registryWatch = codec.probe ? createRegistryWatch(() => codec.probe!(), log) : null;
  const sink = createSink(kafka, codec, metrics, {
    maxRecordBytes: env.PAVER_MAX_OUTPUT_BYTES,
    // Its size and topic only: the record is the service's output, derived from payloads.
    onDropped: (topic, bytes) =>
      log.warn({ topic, bytes }, 'an output record over PAVER_MAX_OUTPUT_BYTES was left out'),
  });

  let resolveExit!: (code: number) => void;
  const exited = new Promise<number>((r) => (resolveExit = r));
  let shuttingDown: Promise<void> | null = null;
  let runner: ReturnType<typeof createRunner<T>> | null = null;
  let parts: ServiceParts<T> | null = null;
  let http: ReturnType<typeof createHttpServer> | null = null;
  let startedUp = false;
  // Filled in as start-up builds what the checks ask; /readyz reads the array on every request.
  const readiness: ReadinessCheck[] = [{ name: 'startup', check: () => startedUp }];

  // The worst reason to stop wins: a fatal error met while a signal's stop drains the chunk in hand (a bug in it,
  // a state conflict) must not leave with 0, which a supervisor reads as a clean stop and may not restart.
  let exitCode = 0;
  const shutdown = (code: number, why: string) => {
    exitCode = Math.max(exitCode, code);
    shuttingDown ??= (async () => {
      log.info({ why }, 'shutting down');
      const timer = setTimeout(() => {
        log.error('shutdown timed out; exiting');
        resolveExit(1);
      }, env.PAVER_SHUTDOWN_TIMEOUT_MS);
      timer.unref();
      const step = async (name: string, fn: () => Promise<unknown> | undefined) => {
        try {
          await fn();
        } catch (err) {
          log.warn({ step: name, err: errorMessage(err) }, 'shutdown step failed');
        }
      };
      await step('consumer', () => runner?.stop());
      await step('service', () => parts?.close?.());
      await step('producer', () => sink.disconnect());
      await step('http', () => http?.close());
      redisWatch.stop();
      registryWatch?.stop();
      await step('redis', () => redis.quit());
      clearTimeout(timer);
      log.info({ exitCode }, 'stopped');
      resolveExit(exitCode);
    })();
  };
  const onSignal = (sig: NodeJS.Signals) => {
    if (shuttingDown) log.warn({ signal: sig }, 'already shutting down');
    else shutdown(0, sig);
  };
  // A supervisor that dies without stopping its services (`paver dev` killed with SIGKILL) cannot signal them,
  // and they would run on as orphans, each holding its port. Polled: Node has no parent-death signal.
  const parent = env.PAVER_PARENT_PID;
  const parentWatch =
    parent === undefined
      ? null
      : setInterval(() => {
          try {
            process.kill(parent, 0);
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code === 'EPERM') return;
            if (parentWatch) clearInterval(parentWatch);
            if (!shuttingDown) shutdown(0, 'parent gone');
          }
        }, 1000);
  parentWatch?.unref();
  const onFatal = (err: Error) => {
    log.fatal({ err: err.message, code: (err as PaverError).code }, 'fatal error');
    shutdown(1, 'fatal');
  };
  // A bug in a timer or a promise nobody awaits: without this, Node ended the process at once with a raw stack
  // (no structured line, the consumer never leaving its group). Offsets are committed only after effects, so
  // the stop finishes or drops the chunk in hand as a SIGTERM does; the exit is 1 all the same. Signals come
  // through the same hub: one listener per signal for the process, however many services it runs.
  const unwatchProcess = watchProcessFaults({
    log,
    stop: (kind) => shutdown(1, kind),
    signal: onSignal,
    exitNow: () => {
      exitCode = 1;
      resolveExit(1);
    },
  });

  /**
   * Start-up, step by step, each step only while no stop was asked. The process's exit waits for the stop,
   * never for start-up: a SIGTERM while start-up retries an unreachable broker (minutes of kafkajs retries)
   * would otherwise wait for all of it, past any grace period.
   */
  const startUp = async () => {
    // HTTP first: /healthz is the process's, and must answer while start-up waits on Kafka, Redis or a table
    // (a startup or liveness probe would otherwise kill a process that is only waiting); /readyz says
    // `startup` false meanwhile.
    http = createHttpServer({ registry: metrics.registry, log, readiness });
    const bound = await http.listen(env.HTTP_PORT ?? spec.defaultPort, env.HTTP_HOST);
    log.info({ port: bound }, 'http listening (/metrics, /healthz, /readyz)');
    readiness.push({ name: 'redis', check: () => redisAnswers() });
    if (registryWatch)
      readiness.push({
        name: 'schema_registry',
        check: () => {
          const why = registryWatch.down();
          return why === null
            ? true
            : { ready: false, reason: `${why}: consumption waits until the registry answers` };
        },
      });
    await redis
      .connect()
      .then(() => checkEviction(redis, log))
      .catch((err: Error) => log.warn({ err: err.message }, 'redis not reachable yet; will retry'));
    if (shuttingDown) return;
    const created = await prepareTopics(kafka, paverTopics(env), env, log, env.KAFKA_CREATE_TOPICS);
    if (created.length) log.info({ created }, 'created topics');
    if (shuttingDown) return;
    await sink.connect();
    if (shuttingDown) return;
    const runtime: RuntimeDeps = {
      env,
      log,
      metrics,
      kafka,
      sink,
      codec,
      onFatal,
      ...(registryWatch
        ? {
            codecWatch: {
              ready: () => registryWatch.down() === null,
              transientFailure: (err: PaverError) => registryWatch.note(err),
            },
          }
        : {}),
    };
    const deps: ServiceDeps<E> = {
      env,
      log,
      metrics,
      redis,
      kafka,
      sink,
      codec,
      fatal: onFatal,
      isRunning: () => shuttingDown === null,
      partitions: () => runner?.owned() ?? null,
      runtime,
    };
    const p = await spec.setup(deps);
    parts = p;
    if (shuttingDown) {
      // The stop may have passed its `service` step already: close what setup built.
      await p.close?.().catch(() => undefined);
      return;
    }
    if (p.extraTopics?.length) await prepareTopics(kafka, p.extraTopics, env, log, env.KAFKA_CREATE_TOPICS);
    if (shuttingDown) return;
    await p.start?.();
    if (shuttingDown) return;
    const consumeWhen = p.consumeWhen;
    runner = createRunner<T>(
      {
        service: spec.name,
        groupId: spec.groupId(env),
        topics: p.inputTopics,
        parse: p.parse,
        handler: p.handler,
        ready: () =>
          redisReady(redis) &&
          redisWatch.down() === null &&
          (registryWatch?.down() ?? null) === null &&
          (consumeWhen?.() ?? true),
        // A command past REDIS_COMMAND_TIMEOUT_MS: a frozen Redis, which keeps its connection open.
        transientFailure: (err) => {
          if (redisCommandTimedOut(err.message)) redisWatch.note('unresponsive');
          registryWatch?.note(err);
        },
        ...(p.onRebalance ? { onRebalance: p.onRebalance } : {}),
        ...(p.keyOf ? { keyOf: p.keyOf } : {}),
      },
      p.inputCodec ? { ...runtime, codec: p.inputCodec } : runtime,
    );
    const r = runner;
    readiness.push(
      { name: 'kafka_broker', check: () => r.brokerReachable() },
      { name: 'kafka_consumer', check: () => r.isJoined() },
      { name: 'kafka_producer', check: () => sink.isConnected() },
      ...(p.readiness ?? []),
    );
    http.setRoutes(p.routes ?? []);
    await runner.start();
    if (shuttingDown) return;
    startedUp = true;
    log.info({ topics: p.inputTopics, groupId: spec.groupId(env) }, 'consuming');
  };
  // It asks the server's role, not just for an answer: a replica (REDIS_URL leading to one after a failover)
  // answers every read and refuses every write, and a service whose writes all fail is not ready.
  const redisAnswers = (): Promise<ReadinessResult> | ReadinessResult => {
    if (!redisReady(redis)) return false;
    if (redisWatch.down() === 'unresponsive')
      return {
        ready: false,
        reason: 'Redis does not answer within REDIS_COMMAND_TIMEOUT_MS: consumption waits until it does',
      };
    return roleOnce().then(
      (role): ReadinessResult => {
        redisWatch.note(role);
        return role === 'replica'
          ? {
              ready: false,
              reason:
                'the Redis server at REDIS_URL is a read-only replica: writes fail with READONLY until it is ' +
                'promoted or REDIS_URL leads to the primary',
            }
          : true;
      },
      () => false,
    );
  };

  startUp().catch((err: unknown) => {
    if (shuttingDown) {
      log.warn({ err: errorMessage(err) }, 'start-up ended by the stop');
      return;
    }
    log.fatal({ err: errorMessage(err) }, 'start-up failed');
    const config = (err as PaverError).code === 'CONFIG_INVALID';
    // Bad configuration files are the operator's to fix: say so on stderr too, and exit like a config error.
    if (config) process.stderr.write(`paver ${spec.name}: ${errorMessage(err)}\n`);
    shutdown(config ? EXIT_CONFIG : 1, 'start-up failed');
  });
  const code = await exited;
  unwatchProcess();
  return code;
}
