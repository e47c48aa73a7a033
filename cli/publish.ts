import { createReadStream } from 'node:fs';
import { access, constants, stat } from 'node:fs/promises';
import { constants as os } from 'node:os';
import type { Readable } from 'node:stream';
import { Kafka, logLevel, Partitioners } from 'kafkajs';
import { z } from 'zod';
import { createCodec, WIRE_HEADER_BYTES } from '../shared/codec.js';
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
import { PRODUCE_REQUEST_BUDGET, recordBatchBytes } from '../shared/kafka/requests.js';
import { ensureTopics, paverTopics } from '../shared/kafka/topics.js';
import { createLogger } from '../shared/log.js';
import { deeperThan, TOO_DEEP } from '../shared/core/json-depth.js';
import { id } from '../schemas/tool-calls.v1.js';

/** Longest a line read waits for others before it is sent. */
const LINGER_MS = 50;

/** After a stop signal, the longest publish still takes what its input already holds. */
const DRAIN_MS = LINGER_MS;

const STOPPED = Symbol('stopped');
const IDLE = Symbol('idle');
/** One full turn of the event loop: input already waiting to be read (a pipe's buffer) is read within it. */
const loopTurn = () => new Promise<typeof IDLE>((r) => setImmediate(() => setImmediate(() => r(IDLE))));

/**
 * The chunks of `input` until `stop.signal` is set (and `stop.wake` called); then only those at hand — in the
 * stream's buffer, or waiting to be read, as the lines written before the signal are — for at most DRAIN_MS,
 * and no more. `stop.cut` says, once it has ended, whether it ended by the stop rather than at the input's end.
 */
async function* untilStopped(
  input: Readable,
  stop: { signal: NodeJS.Signals | null; wake: () => void; cut: boolean },
): AsyncGenerator<unknown> {
  const it = input[Symbol.asyncIterator]();
  let next = it.next();
  let drainUntil = 0;
  try {
    for (;;) {
      let r: IteratorResult<unknown> | typeof STOPPED | typeof IDLE;
      if (stop.signal === null)
        // A promise per wait, not one for the whole run: each race would leave a reaction on a long-lived one.
        r = await Promise.race([next, new Promise<typeof STOPPED>((w) => (stop.wake = () => w(STOPPED)))]);
      else if (input.readableLength > 0) r = await next;
      else {
        drainUntil ||= Date.now() + DRAIN_MS;
        r = await Promise.race([
          next,
          Date.now() < drainUntil ? loopTurn() : Promise.resolve<typeof IDLE>(IDLE),
        ]);
      }
      if (r === STOPPED) continue;
      if (r === IDLE) {
        stop.cut = true;
        return;
      }
      if (r.done) return;
      yield r.value;
      next = it.next();
    }
  } finally {
    // The read left waiting ends with the stream (its premature-close rejection is expected, not a failure).
    next.catch(() => undefined);
    input.destroy();
  }
}

/**
 * Ends the process by `signal`, with Node's default action back in place, as the offline commands do
 * (shared/output.ts): a shell says 130 (SIGINT) or 143 (SIGTERM), and a shell loop running publish stops too.
 * Returns the code to exit with when a listener of someone else's keeps the signal from ending it.
 */
function endBy(signal: NodeJS.Signals): number {
  if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
  return 128 + os.signals[signal];
}

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
    // The contract's own id rule: every tenant or agent a producer may send can be set (a space included).
    ['--tenant', opts.tenant, id],
    ['--agent', opts.agent, id],
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
  // SIGINT/SIGTERM while reading: the lines read are sent and the summary said, then the process ends by the
  // signal. Killed by it at once (Node's default), a live input lost the lines lingering for their send (up to
  // 50 ms of them) and the summary. Before reading starts nothing is lost, and the default stands.
  const stop = { signal: null as NodeJS.Signals | null, wake: () => undefined as void, cut: false };
  const onSignal = (signal: NodeJS.Signals) => {
    if (stop.signal === null) {
      stop.signal = signal;
      process.stderr.write(
        `paver publish: ${signal}: sending the lines read, then stopping (${signal} again stops at once)\n`,
      );
      stop.wake();
      return;
    }
    // A second signal does not wait for the sends (a broker that does not answer takes seconds of retries).
    process.stderr.write(`paver publish: ${signal} again: stopped at once after ${sent} events sent\n`);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    process.exit(endBy(signal));
  };
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
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    // Lines stream through a bounded reader: one endless line must not be held whole (readline would).
    let lineNo = 0;
    for await (const line of boundedLines(untilStopped(input, stop), env.PAVER_MAX_MESSAGE_BYTES)) {
      lineNo++;
      // The input ended by the stop in the middle of a line: its writer had not finished it.
      if (stop.cut) {
        process.stderr.write(`paver publish: line ${lineNo}: cut short by the stop; not sent\n`);
        break;
      }
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
        // The line's own bytes go out, unless --tenant/--agent change a value: written again from the parsed
        // object, an id past 2^53 loses its last digits, 1.0 becomes 1, integer-like keys move first and \u
        // escapes are unescaped, in data the user's other consumers read too.
        const rewrite =
          (opts.tenant !== undefined && o.tenant_id !== opts.tenant) ||
          (opts.agent !== undefined && o.agent_id !== opts.agent);
        if (opts.tenant !== undefined) o.tenant_id = opts.tenant;
        if (opts.agent !== undefined) o.agent_id = opts.agent;
        if (typeof o.session_id === 'string') key = o.session_id;
        const json = Buffer.from(rewrite ? JSON.stringify(o) : text);
        value = json;
        if (codec.kind === 'registry')
          try {
            // The registry checks the event and gives the framing (magic byte, schema id); the JSON is the line's.
            const framed = await codec.encode('tool-calls.v1', topic, o);
            value = Buffer.concat([framed.subarray(0, WIRE_HEADER_BYTES), json]);
          } catch {
            // Refused by its schema, or no registry: sent as JSON text, and the services dead-letter or read it.
          }
      }
      // The reader bounds a line's characters, and one takes up to 3 bytes: a line of multi-byte text (an output
      // in Chinese) can be under the bound in characters and over it in bytes. The services would dead-letter it
      // (oversize), and the broker refuses it over 1 MiB, failing the send and with it the lines that follow.
      // Counted as the broker counts its message.max.bytes, key and record batch framing included: on its value
      // alone, a line within about 80 bytes of 1 MiB would pass here and the broker refuse it.
      if (
        recordBatchBytes(key === null ? null : Buffer.byteLength(key), value.length) >
        env.PAVER_MAX_MESSAGE_BYTES
      ) {
        process.stderr.write(
          `paver publish: line ${lineNo}: longer than PAVER_MAX_MESSAGE_BYTES (${env.PAVER_MAX_MESSAGE_BYTES}) as a Kafka record (key and framing included); not sent\n`,
        );
        continue;
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
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    clearTimeout(linger);
    // A send the timer started ends before the producer goes (its failure, if any, is the one reported).
    await sending.catch(() => undefined);
    await producer.disconnect().catch(() => undefined);
    await admin.disconnect().catch(() => undefined);
  }
  if (stop.signal === null) {
    process.stderr.write(`published ${sent} events to ${topic}\n`);
    return 0;
  }
  const signal = stop.signal;
  // Once the summary is out: the signal's default action does not wait for a pending write.
  return new Promise((resolve) =>
    process.stderr.write(`published ${sent} events to ${topic} (stopped by ${signal})\n`, () =>
      resolve(endBy(signal)),
    ),
  );
}
