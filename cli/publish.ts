import { createReadStream } from 'node:fs';
import { access, constants, stat } from 'node:fs/promises';
import { Kafka, logLevel, Partitioners } from 'kafkajs';
import { z } from 'zod';
import { createCodec } from '../shared/codec.js';
import {
  commonEnvShape,
  crossChecked,
  EXIT_CONFIG,
  parseEnv,
  refineCommon,
  topicName,
} from '../shared/config.js';
import { errorMessage } from '../shared/errors.js';
import { boundedLines } from '../shared/jsonl.js';
import { kafkaConfig } from '../shared/kafka/client.js';
import { PRODUCE_REQUEST_BUDGET } from '../shared/kafka/requests.js';
import { ensureTopics, paverTopics } from '../shared/kafka/topics.js';
import { createLogger } from '../shared/log.js';
import { deeperThan, TOO_DEEP } from '../shared/core/json-depth.js';

/** Longest a line read waits for others before it is sent. */
const LINGER_MS = 50;

/** Exit code when no broker answers (sysexits EX_UNAVAILABLE). */
export const EXIT_UNAVAILABLE = 69;

/**
 * publish talks to Kafka only: REDIS_URL is accepted (shared .env files) but not required; the placeholder
 * default only keeps the shared config type whole and is never connected to.
 */
const publishEnvSchema = crossChecked(
  z.object({ ...commonEnvShape, REDIS_URL: commonEnvShape.REDIS_URL.default('redis://unused.invalid:6379') }),
  refineCommon,
);

const idSchema = z.string().regex(/^[A-Za-z0-9._:-]{1,128}$/, 'expected 1-128 characters of [A-Za-z0-9._:-]');

/**
 * `paver publish --input FILE.jsonl`: sends each line to the tool-calls topic keyed by its session_id, as an
 * agent runtime would. Lines are sent as they are (the services validate and dead-letter bad ones), except
 * that --tenant / --agent set tenant_id / agent_id on every JSON object line.
 */
export async function publish(opts: {
  input: string;
  topic?: string;
  tenant?: string;
  agent?: string;
  env?: NodeJS.ProcessEnv;
}): Promise<number> {
  const fail = (code: number, line: string) => {
    process.stderr.write(`paver publish: ${line}\n`);
    return code;
  };
  // Usage errors, said before connecting: a --topic '' was sent to, and refused by the broker after the
  // connection (or read as 'no broker', exit 69, when none answered); a bad --tenant/--agent exited 78, the code
  // of a bad environment, where every other command says 2 for a bad flag.
  for (const [flag, v, schema] of [
    ['--topic', opts.topic, topicName],
    ['--tenant', opts.tenant, idSchema],
    ['--agent', opts.agent, idSchema],
  ] as const) {
    if (v === undefined) continue;
    const r = schema.safeParse(v);
    if (!r.success) return fail(2, `${flag}: ${r.error.issues[0]?.message}`);
  }
  let env: z.infer<typeof publishEnvSchema>;
  try {
    env = parseEnv(publishEnvSchema, opts.env ?? process.env);
  } catch (err) {
    // One line: "Invalid configuration (2 problem(s)): KAFKA_BROKERS: is required; LOG_LEVEL: …".
    return fail(
      EXIT_CONFIG,
      errorMessage(err)
        .replace(/:\n\s+- /, ': ')
        .replace(/\n\s+- /g, '; '),
    );
  }
  // '-' is process.stdin itself: opening /dev/stdin fails with ENXIO when stdin is a socket (a child process
  // spawned by Node with stdio 'pipe', many supervisors), and the command failed after connecting.
  const stdin = opts.input === '-';
  if (!stdin)
    try {
      await access(opts.input, constants.R_OK);
      // A directory passes access(): it was found out only after connecting, as 'failed after 0 events: EISDIR'.
      if ((await stat(opts.input)).isDirectory()) throw new Error('it is a directory');
    } catch (err) {
      // The reason too: a missing file and one without read permission are fixed differently.
      return fail(2, `cannot read --input ${opts.input}: ${errorMessage(err)}`);
    }

  const log = createLogger('publish', env.LOG_LEVEL === 'info' ? 'warn' : env.LOG_LEVEL);
  // Quiet and quick to give up: with no broker, one clear line beats half a minute of client retries.
  const kafka = new Kafka({
    ...kafkaConfig(env, log, `${env.KAFKA_CLIENT_ID}-publish`),
    retry: { initialRetryTime: 300, retries: 3, maxRetryTime: 2_000 },
    logLevel: logLevel.NOTHING,
  });
  const topic = opts.topic ?? env.PAVER_TOPIC_TOOL_CALLS;
  const admin = kafka.admin();
  try {
    await admin.connect();
    await admin.describeCluster();
  } catch (err) {
    await admin.disconnect().catch(() => undefined);
    return fail(
      EXIT_UNAVAILABLE,
      `no Kafka broker answered at ${env.KAFKA_BROKERS.join(',')} (${errorMessage(err)}); is the stack running (npm start)?`,
    );
  }
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  let sent = 0;
  let linger: NodeJS.Timeout | undefined;
  let sending: Promise<void> = Promise.resolve();
  try {
    if (env.KAFKA_CREATE_TOPICS)
      await ensureTopics(admin, paverTopics(env), {
        partitions: env.KAFKA_TOPIC_PARTITIONS,
        replicationFactor: env.KAFKA_REPLICATION_FACTOR,
      });
    // Asked before sending: the broker's answer to a send was 'failed after 0 events: This server does not host
    // this topic-partition', which does not say that the topic is missing, nor that publish creates only Paver's.
    if (!(await admin.listTopics()).includes(topic))
      return fail(
        1,
        `topic '${topic}' does not exist on ${env.KAFKA_BROKERS.join(',')}: create it, or give --topic an existing one (publish creates only Paver's own topics, with KAFKA_CREATE_TOPICS)`,
      );
    await producer.connect();
    const codec = createCodec(env);
    let batch: { key: string | null; value: Buffer }[] = [];
    let batchBytes = 0;
    // Sends run one after another (a session's events land in line order), and a batch goes out at the latest
    // LINGER_MS after its first line: flushed only when full or at the end, the lines of a live stdin (a tail -f
    // into publish) waited for 500 more that might never come, and a Ctrl-C lost them all.
    const flush = (): Promise<void> => {
      clearTimeout(linger);
      linger = undefined;
      if (batch.length === 0) return sending;
      const messages = batch;
      batch = [];
      batchBytes = 0;
      sending = sending.then(async () => {
        await producer.send({ topic, messages, acks: -1 });
        sent += messages.length;
      });
      return sending;
    };
    const input = stdin ? process.stdin : createReadStream(opts.input);
    // A send the timer started that fails ends the reading with its error: the loop may never await another
    // flush (a live stdin sends fewer than 500 lines), and every later send, chained onto the failed one, was
    // skipped, so the lines that followed were dropped without a word while the command went on reading.
    const lingerFlush = () => void flush().catch((err: unknown) => input.destroy(err as Error));
    // Lines stream through a bounded reader: one endless line must not be held whole (readline would).
    let lineNo = 0;
    for await (const line of boundedLines(input, env.PAVER_MAX_MESSAGE_BYTES)) {
      lineNo++;
      if (line === null) {
        process.stderr.write(
          `paver publish: line ${lineNo}: longer than PAVER_MAX_MESSAGE_BYTES (${env.PAVER_MAX_MESSAGE_BYTES}); not sent\n`,
        );
        continue;
      }
      // A byte order mark (some Windows tools write one) made the first line not JSON: sent raw, without its
      // session key, and dead-lettered. The offline commands read past it too.
      const text = lineNo === 1 && line.charCodeAt(0) === 0xfeff ? line.slice(1) : line;
      if (!text.trim()) continue;
      let key: string | null = null;
      let value: Buffer = Buffer.from(text);
      let obj: unknown;
      try {
        obj = JSON.parse(text);
      } catch {
        // Not JSON: sent as is, so the services' dead-letter path can be seen working.
      }
      // Too deep to write back: sent as is too (the services dead-letter it), rather than failing the command.
      const tooDeep = obj !== null && typeof obj === 'object' && deeperThan(obj);
      if (tooDeep)
        process.stderr.write(
          `paver publish: line ${lineNo}: ${TOO_DEEP}; sent as is, and the services dead-letter it\n`,
        );
      if (obj !== null && typeof obj === 'object' && !Array.isArray(obj) && !tooDeep) {
        const o = obj as Record<string, unknown>;
        if (opts.tenant !== undefined) o.tenant_id = opts.tenant;
        if (opts.agent !== undefined) o.agent_id = opts.agent;
        if (typeof o.session_id === 'string') key = o.session_id;
        try {
          value = await codec.encode('tool-calls.v1', topic, o);
        } catch {
          value = Buffer.from(JSON.stringify(o));
        }
      }
      // Under the services' produce budget too: kafkajs sends a partition's records of one request as one
      // record batch, which the broker refuses above its message.max.bytes (1 MiB by default), so 500 events of
      // one session with 3 KB outputs failed the command.
      const size = value.length + (key === null ? 0 : Buffer.byteLength(key));
      if (batchBytes + size > PRODUCE_REQUEST_BUDGET) await flush();
      batch.push({ key, value });
      batchBytes += size;
      if (batch.length >= 500) await flush();
      else linger ??= setTimeout(lingerFlush, LINGER_MS);
    }
    await flush();
  } catch (err) {
    return fail(1, `failed after ${sent} events: ${errorMessage(err)}`);
  } finally {
    clearTimeout(linger);
    // A send the timer started ends before the producer goes (its failure, if any, is the one reported).
    await sending.catch(() => undefined);
    await producer.disconnect().catch(() => undefined);
    await admin.disconnect().catch(() => undefined);
  }
  process.stderr.write(`published ${sent} events to ${topic}\n`);
  return 0;
}
