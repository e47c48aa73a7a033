import { randomUUID } from 'node:crypto';
import { Kafka, Partitioners, logLevel, type KafkaConfig, type Producer } from 'kafkajs';
import { z } from 'zod';
import {
  id,
  toolCallsEventV1,
  type taskCompletedEvent,
  type toolCallEvent,
  type userMessageEvent,
  type ToolCallsEvent,
} from '../schemas/index.js';
import { createCodec, WIRE_HEADER_BYTES, type Codec } from '../shared/codec.js';
import { PaverError, errorMessage } from '../shared/errors.js';
import { describeIssues } from '../shared/jsonl.js';
import { produceRequests, recordBatchBytes } from '../shared/kafka/requests.js';

/** The topic the services read tool-calls events from (PAVER_TOPIC_TOOL_CALLS). */
export const DEFAULT_TOOL_CALLS_TOPIC = 'paver.tool-calls.v1';

/**
 * The default `maxMessageBytes`: a default broker's message.max.bytes (and a topic's max.message.bytes when it is
 * not set), 1 MiB plus the 12 bytes of log overhead (offset and length) Kafka counts in a record batch. The
 * publisher counts a record as the broker does (`recordBatchBytes`, framing included), so at 1 MiB it refused
 * events of the last 12 bytes that a default broker takes.
 */
export const DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12;

/** Tasks whose next `step` the publisher counts at once (those without `taskCompleted` included). */
export const MAX_OPEN_TASKS = 100_000;

/**
 * Failed calls, not taken up by their caller, that the publisher keeps until the next flush(); past it, a failure
 * is counted but its call is not kept (see `failed`).
 */
export const MAX_UNREPORTED_FAILURES = 1_000;

type Generated = 'type' | 'event_id' | 'ts' | 'tenant_id' | 'agent_id';
// Flattened so editors show the event's fields, not a chain of Omit<…>.
type Optional<T, K extends keyof T> = {
  [P in keyof (Omit<T, K> & Partial<Pick<T, K>>)]: (Omit<T, K> & Partial<Pick<T, K>>)[P];
};

/**
 * A tool call as the agent runtime knows it. `event_id` (a UUID), `ts` (now) and `tenant_id`/`agent_id`
 * (the publisher's defaults) are filled in when left out; `step` counts 0, 1, 2… per task when left out.
 */
export type ToolCallInput = Optional<
  Omit<z.input<typeof toolCallEvent>, 'type'>,
  Exclude<Generated, 'type'> | 'step'
>;
export type UserMessageInput = Optional<
  Omit<z.input<typeof userMessageEvent>, 'type'>,
  Exclude<Generated, 'type'>
>;
export type TaskCompletedInput = Optional<
  Omit<z.input<typeof taskCompletedEvent>, 'type'>,
  Exclude<Generated, 'type'>
>;

export interface PublisherOptions {
  /** An existing kafkajs producer. The publisher does not connect or disconnect it: its owner does. */
  producer?: Producer;
  /** Bootstrap brokers (`host:port`), when the publisher makes its own producer. */
  brokers?: string[];
  /**
   * Extra kafkajs client settings (ssl, sasl, clientId…) for the publisher's own producer. Its kafkajs logs are
   * off unless `logLevel` or `logCreator` is given: failures are the rejections of the publisher's promises.
   */
  kafka?: Omit<KafkaConfig, 'brokers'>;
  /** Defaults to paver.tool-calls.v1. */
  topic?: string;
  /** Confluent schema registry: values go out in its wire format (magic byte, schema id, JSON). */
  schemaRegistry?: string | { url: string; username?: string; password?: string };
  tenantId?: string;
  agentId?: string;
  /**
   * Events queued before a send starts at once (default 500). A send goes out in produce requests of at most
   * 512 KiB of keys and values each (one larger event goes alone), under the broker's record-batch limit.
   */
  batchSize?: number;
  /** How long an event may wait for others before it is sent (default 5 ms); flush() sends at once. */
  lingerMs?: number;
  /**
   * Largest event accepted, counted as the broker counts it against message.max.bytes: the record batch it goes
   * out in, key and framing included (default DEFAULT_MAX_MESSAGE_BYTES, 1,048,588: a default broker's
   * message.max.bytes; the value of any event it accepts is under the services' PAVER_MAX_MESSAGE_BYTES, 1 MiB).
   * Set it to the topic's max.message.bytes when that is lower.
   */
  maxMessageBytes?: number;
}

export interface Publisher {
  /**
   * Validates and queues one tool call; resolves once Kafka has acknowledged it (acks=all). After a failed send
   * or encode of its session it rejects until that failure has reached the caller (see docs/client.md).
   */
  toolCall(event: ToolCallInput): Promise<void>;
  userMessage(event: UserMessageInput): Promise<void>;
  taskCompleted(event: TaskCompletedInput): Promise<void>;
  /**
   * Sends everything queued; resolves when all of it is acknowledged, rejects with the first failure
   * (invalid event or failed send) since the previous flush that has not reached the caller already: a call
   * whose promise was awaited or given a handler before this flush had its failure there. Past
   * MAX_UNREPORTED_FAILURES failed calls not taken up, the rest are counted, not kept (see docs/client.md).
   */
  flush(): Promise<void>;
  /** Flushes, then disconnects the producer if the publisher made it. Later calls reject. */
  close(): Promise<void>;
}

/** The scalar options, as Kafka and the services take them; the rest is kafkajs's to check. */
const publisherOptions = z.object({
  topic: z
    .string()
    .regex(/^[a-zA-Z0-9._-]{1,249}$/, 'a Kafka topic name: 1 to 249 of a-z A-Z 0-9 . _ -')
    .optional(),
  tenantId: id.optional(),
  agentId: id.optional(),
  batchSize: z.number().int().min(1).max(1_000_000).optional(),
  lingerMs: z.number().int().min(0).max(3_600_000).optional(),
  maxMessageBytes: z.number().int().min(1).optional(),
});

interface Pending {
  key: string;
  /** The encode, started at the call; the send waits for it (see `enqueue`). */
  encoded: Promise<Buffer>;
  resolve: () => void;
  reject: (err: unknown) => void;
  /** Gives back what the call took of its task's step count (see `guard`). */
  undo?: () => void;
}

/**
 * A call's promise that knows whether its caller has taken it up: `await`, `.then`/`.catch`/`.finally` and
 * Promise.all/allSettled/race all call `then`. What the caller took up has reached it; flush() reports only the
 * rest, so each failure is reported once.
 */
class CallPromise extends Promise<void> {
  seen = false;
  onSeen: (() => void) | undefined;
  // Promises made from it (by then, catch, finally) are plain ones.
  static override get [Symbol.species]() {
    return Promise;
  }
  override then<A = void, B = never>(
    onfulfilled?: ((value: void) => A | PromiseLike<A>) | null,
    onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    if (!this.seen) {
      this.seen = true;
      this.onSeen?.();
    }
    return super.then(onfulfilled, onrejected);
  }
}

/**
 * Publishes tool-calls events the way the Paver services expect them: validated by the same zod contract,
 * keyed by session_id (one session stays on one partition, in order), JSON or Confluent wire format.
 */
export function createPublisher(opts: PublisherOptions): Publisher {
  if (!opts.producer && !opts.brokers?.length) {
    throw new PaverError('CONFIG_INVALID', 'createPublisher: give either `producer` or `brokers`');
  }
  // A batch size of 0 never sent, a negative linger or a topic name Kafka refuses failed only at the first send
  // (or never): refused here, with the option named.
  const checked = publisherOptions.safeParse(opts);
  if (!checked.success)
    throw new PaverError('CONFIG_INVALID', `createPublisher: ${describeIssues(checked.error.issues)}`);
  const topic = opts.topic ?? DEFAULT_TOOL_CALLS_TOPIC;
  const batchSize = opts.batchSize ?? 500;
  const lingerMs = opts.lingerMs ?? 5;
  const maxBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const registry =
    typeof opts.schemaRegistry === 'string' ? { url: opts.schemaRegistry } : opts.schemaRegistry;
  const codec: Codec = createCodec({
    SCHEMA_REGISTRY_URL: registry?.url,
    SCHEMA_REGISTRY_USERNAME: registry?.username,
    SCHEMA_REGISTRY_PASSWORD: registry?.password,
  });

  const owned = !opts.producer;
  const producer =
    opts.producer ??
    new Kafka({
      clientId: 'paver-publisher',
      // Quiet unless asked (a logLevel, or a logCreator, which then gets kafkajs's default level): every failure
      // reaches the caller as the rejection of its call and of flush()/close(), and kafkajs's ERROR lines
      // (each refused connection, each retry) went on the agent's stderr as well, in kafkajs's own format.
      ...(opts.kafka?.logCreator ? {} : { logLevel: logLevel.NOTHING }),
      ...opts.kafka,
      brokers: opts.brokers!,
    }).producer({
      // Java-compatible murmur2: a session lands on the partition any other producer would choose.
      createPartitioner: Partitioners.DefaultPartitioner,
    });
  let connected: Promise<void> | null = owned ? null : Promise.resolve();
  // A failed connection is forgotten, so the next send tries again: kept, its rejection failed every later
  // event of a publisher made while the broker was down (an agent started before Kafka), for ever.
  const connect = () =>
    (connected ??= producer.connect().catch((err: unknown) => {
      connected = null;
      throw err;
    }));

  // Next step per open task. A task never completed (its agent crashed) would keep its entry for the life of
  // the process: the least recently used go past MAX_OPEN_TASKS (a Map iterates in insertion order).
  const steps = new Map<string, number>();
  let queue: Pending[] = [];
  // Queued events neither sent nor failed yet, in call order.
  const outstanding = new Set<Pending>();
  let timer: NodeJS.Timeout | null = null;
  // Sends run one after another, so events of one session reach the partition in call order.
  let chain: Promise<void> = Promise.resolve();
  let closed = false;
  let closing: Promise<void> | null = null;
  // Failed calls whose caller has not taken up the promise, oldest first: flush() and close() report the first,
  // so a caller that does not await each event still learns that some were not published. A call whose promise
  // the caller did take up (awaited, chained on, passed to Promise.all) has had its failure: flush() reporting it
  // again would give a caller that awaited the call and then flushed one failure twice.
  const unseen = new Map<CallPromise, unknown>();
  // Kept, every call failed during a long outage (a fire-and-forget agent calling on while Kafka is down) stayed
  // in memory until the next flush(): past MAX_UNREPORTED_FAILURES, a failure is only counted (`overflow`, its
  // first error kept), and flush() reports that error when none of the kept ones is left to report. Its call
  // still knows when it is taken up (`onSeen` is its own, not the publisher's); `generation` tells it a flush()
  // has reported it since.
  let overflow = 0;
  let overflowFirst: unknown;
  let generation = 0;
  // A session whose event failed to send is held: its later events fail too (`blocked` holds their error), so
  // none lands after the gap, until none of its events is still on the way (`live`) and the caller has had
  // every failure of it (`unseenBySession`), from the calls or from flush(). Its events then go out again: a
  // retry of what failed first.
  const blocked = new Map<string, PaverError>();
  // The failures that hold a session: a failed send or encode, after later calls of the session had taken their
  // steps (a call refused at once does not: nothing was taken after it).
  const blocking = new WeakSet<object>();
  const live = new Map<string, number>();
  const unseenBySession = new Map<string, number>();
  const count = (m: Map<string, number>, key: string, by: number) => {
    const n = (m.get(key) ?? 0) + by;
    if (n > 0) m.set(key, n);
    else m.delete(key);
  };
  const release = (session: string) => {
    if (!live.has(session) && !unseenBySession.has(session)) blocked.delete(session);
  };
  const failed = (call: CallPromise, session: string | undefined, err: unknown) => {
    if (call.seen) return;
    const kept = unseen.size < MAX_UNREPORTED_FAILURES;
    if (kept) unseen.set(call, err);
    else if (overflow++ === 0) overflowFirst = err;
    const holds = session !== undefined && blocking.has(err as object);
    if (holds) count(unseenBySession, session, 1);
    const reportedBy = generation;
    call.onSeen = () => {
      if (reportedBy !== generation) return;
      if (kept) unseen.delete(call);
      else overflow--;
      if (!holds) return;
      count(unseenBySession, session, -1);
      release(session);
    };
  };
  const report = () => {
    const first = unseen.values().next();
    const unreported = !first.done || overflow > 0;
    const err = first.done ? overflowFirst : first.value;
    generation++;
    unseen.clear();
    overflow = 0;
    overflowFirst = undefined;
    unseenBySession.clear();
    for (const session of blocked.keys()) release(session);
    if (unreported) throw err;
  };

  // `failing` (queued, of one failure) is not published: its sessions are held, and their events queued behind
  // it (in call order) fail too, so none lands after the gap. Every one of them gives its step back.
  const holdBack = (failing: Pending[], err: PaverError, held: PaverError) => {
    blocking.add(err);
    blocking.add(held);
    const failingSet = new Set(failing);
    const sessions = new Set<string>();
    const dropped: Pending[] = [];
    // `outstanding` is in call order: a session's events before the failed one are not behind it.
    for (const p of outstanding) {
      if (failingSet.has(p)) sessions.add(p.key);
      else if (!sessions.has(p.key)) continue;
      dropped.push(p);
    }
    for (const session of sessions) blocked.set(session, held);
    for (const p of dropped) outstanding.delete(p);
    // Last call first: each gives its step back only while it is still its task's latest.
    for (let i = dropped.length - 1; i >= 0; i--) dropped[i]!.undo?.();
    for (const p of dropped) p.reject(failingSet.has(p) ? err : held);
  };

  const sendNow = (): Promise<void> => {
    if (timer) clearTimeout(timer);
    timer = null;
    const batch = queue;
    queue = [];
    if (batch.length === 0) return chain;
    chain = chain.then(async () => {
      // Events held back by a failure while they waited are settled already.
      let todo = batch.filter((p) => outstanding.has(p));
      if (todo.length === 0) return;
      // Queued at the call and encoded here, so the batch is in call order whichever encode answered first.
      const values = new Map<Pending, Buffer>();
      const encodes = await Promise.allSettled(todo.map((p) => p.encoded));
      encodes.forEach((r, i) => {
        const p = todo[i]!;
        if (r.status === 'fulfilled') return void values.set(p, r.value);
        // Already dropped behind an earlier failure of its session in this batch.
        if (!outstanding.has(p)) return;
        const err =
          r.reason instanceof PaverError
            ? r.reason
            : new PaverError('INTERNAL', `encode failed: ${errorMessage(r.reason)}`, { cause: r.reason });
        const held = new PaverError(
          err.code,
          `not sent: an earlier event of its session failed to encode (${errorMessage(err)})`,
          { cause: err },
        );
        holdBack([p], err, held);
      });
      todo = todo.filter((p) => outstanding.has(p));
      if (todo.length === 0) return;
      // The broker refuses a partition's record batch over its message.max.bytes (1 MiB by default) whole,
      // however small each event is: a burst goes out in requests under a byte budget, one after another.
      const requests = produceRequests(
        todo,
        todo.map((p) => values.get(p)!.length + Buffer.byteLength(p.key)),
      );
      let sent = 0;
      try {
        await connect();
        for (const request of requests) {
          await producer.send({
            topic,
            acks: -1,
            messages: request.map((p) => ({ key: p.key, value: values.get(p)! })),
          });
          for (const p of request) {
            outstanding.delete(p);
            p.resolve();
          }
          sent += request.length;
        }
      } catch (err) {
        const e = new PaverError('KAFKA_UNAVAILABLE', `publish to ${topic} failed: ${errorMessage(err)}`, {
          cause: err,
        });
        const held = new PaverError(
          'KAFKA_UNAVAILABLE',
          `not sent: an earlier event of its session failed to publish to ${topic} (${errorMessage(err)})`,
          { cause: err },
        );
        // What follows a failed request is not sent: a session's later events never land before its earlier. Nor
        // do the session's events queued behind it, in this publisher's later sends: they fail now too.
        holdBack(todo.slice(sent), e, held);
      }
    });
    return chain;
  };

  // An event's encoded size is known before any await: its JSON text (the registry codec writes that text behind
  // the wire format's header). Checked when the call is made, so that a call refused for its size takes no step
  // of its task: checked after the asynchronous encode, it came after the step was taken, and the task's next
  // call skipped a number. The text is returned for a codec that sends it as it is (JSON), not made twice.
  const sized = (event: ToolCallsEvent): string | undefined => {
    let text: string | undefined;
    let bytes: number;
    try {
      text = codec.encodeText?.(event);
      bytes =
        text === undefined
          ? WIRE_HEADER_BYTES + Buffer.byteLength(JSON.stringify(event))
          : Buffer.byteLength(text);
    } catch (err) {
      // The contract takes any value as args or observation; one JSON cannot write (a BigInt from a database
      // driver, a circular object) is as invalid an event, and said so with the code a caller checks for.
      throw new PaverError('INPUT_INVALID', `${event.type} event is not JSON: ${errorMessage(err)}`, {
        cause: err,
      });
    }
    tooBig(event, bytes);
    return text;
  };
  // The broker holds a record batch to its message.max.bytes with the key and the framing counted, so the
  // limit is held to that too: on the value alone, an event within about 80 bytes of the limit would pass here
  // and be refused by the broker as a failed send (failing the events sent with it).
  const tooBig = (event: ToolCallsEvent, valueBytes: number) => {
    const bytes = recordBatchBytes(Buffer.byteLength(event.session_id), valueBytes);
    if (bytes > maxBytes)
      throw new PaverError(
        'INPUT_INVALID',
        `${event.type} event is ${bytes} bytes as a Kafka record (key and framing included), over the ${maxBytes}-byte limit`,
      );
  };

  // Queued at the call, not when its encode (async with a registry: the schema id) answers: the queue is in call
  // order whatever each encode waits for, and an encode that fails is known before any later event of its session
  // is sent, so it holds the session as a failed send does. The send waits for the batch's encodes.
  const enqueue = (
    event: ToolCallsEvent,
    text: string | undefined,
    undo: (() => void) | undefined,
  ): Promise<void> => {
    const encoded =
      text === undefined
        ? codec.encode('tool-calls.v1', topic, event).then((value) => {
            // The check at the call sized the text the codec writes; this one holds the limit should a codec's
            // framing ever differ from that (the broker would refuse the whole batch the record went in).
            tooBig(event, value.length);
            return value;
          })
        : Promise.resolve(Buffer.from(text));
    // Its failure is the call's, given by the send: not an unhandled rejection meanwhile.
    void encoded.catch(() => undefined);
    const done = new Promise<void>((resolve, reject) => {
      const p: Pending = { key: event.session_id, encoded, resolve, reject, undo };
      queue.push(p);
      outstanding.add(p);
    });
    if (queue.length >= batchSize) void sendNow();
    else timer ??= setTimeout(() => void sendNow(), lingerMs);
    return done;
  };

  const complete = (type: ToolCallsEvent['type'], e: Record<string, unknown>): ToolCallsEvent => {
    const withDefaults = {
      event_id: randomUUID(),
      ts: Date.now(),
      ...(opts.tenantId ? { tenant_id: opts.tenantId } : {}),
      ...(opts.agentId ? { agent_id: opts.agentId } : {}),
      // A field given as undefined (a wrapper passing its own optional values through) is one left out: spread
      // as it is, it took the place of the default, and the event was refused or went to the 'default' scope.
      ...Object.fromEntries(Object.entries(e).filter(([, v]) => v !== undefined)),
      type,
    };
    const parsed = toolCallsEventV1.safeParse(withDefaults);
    if (!parsed.success) {
      const issues = parsed.error.issues.map((i) => `${i.path.join('.') || '(event)'}: ${i.message}`);
      throw new PaverError('INPUT_INVALID', `invalid ${type} event: ${issues.join('; ')}`);
    }
    return parsed.data;
  };
  // The scope the event is published under: its own, the publisher's, or the contract's default.
  const taskKey = (e: { tenant_id?: string; agent_id?: string; session_id: string; task_id: string }) =>
    JSON.stringify([
      e.tenant_id ?? (opts.tenantId || 'default'),
      e.agent_id ?? (opts.agentId || 'default'),
      e.session_id,
      e.task_id,
    ]);

  // Validation errors surface as rejected promises, like send errors: one way to handle failures. Each
  // promise is marked handled so an agent that fires and forgets is not crashed by an unhandled
  // rejection; flush() reports the failure instead. `accepted` runs only for an event that passed every check
  // made at the call (the contract, the size): a tool call's step is taken there, not before. What it returns
  // undoes that when the event is not published after all (a failed send): an agent retrying a call that
  // failed gets the step the call had, and its task's steps stay 0, 1, 2… as the contract counts them.
  const guard = (f: () => { event: ToolCallsEvent; accepted?: () => () => void }): Promise<void> => {
    let done: Promise<void>;
    let session: string | undefined;
    let counted = false;
    try {
      if (closed) throw new PaverError('SHUTTING_DOWN', 'publisher is closed');
      const { event, accepted } = f();
      session = event.session_id;
      // Held before its step is taken: the retry of the failed call gets the step it had.
      const held = blocked.get(session);
      if (held) throw held;
      const text = sized(event);
      count(live, session, 1);
      counted = true;
      done = enqueue(event, text, accepted?.());
    } catch (err) {
      done = Promise.reject(err);
    }
    const call = new CallPromise((resolve, reject) => void done.then(resolve, reject));
    // Handled here without counting as the caller's: a fire-and-forget call never crashes the process.
    void Promise.prototype.then.call(call, undefined, () => undefined);
    done.catch((err: unknown) => failed(call, session, err));
    if (counted) {
      const s = session!;
      const settled = () => {
        count(live, s, -1);
        release(s);
      };
      void done.then(settled, settled);
    }
    return call;
  };

  return {
    toolCall(e) {
      return guard(() => {
        const key = taskKey(e);
        const step = e.step ?? steps.get(key) ?? 0;
        const event = complete('tool_call', { ...e, step });
        const accepted = () => {
          const before = steps.get(key);
          steps.delete(key);
          steps.set(key, step + 1);
          if (steps.size > MAX_OPEN_TASKS) steps.delete(steps.keys().next().value!);
          // Only while no later call of the task has taken the next step: a retry numbered below it would be out
          // of order.
          return () => {
            if (steps.get(key) !== step + 1) return;
            steps.delete(key);
            if (before !== undefined) steps.set(key, before);
          };
        };
        return { event, accepted };
      });
    },
    userMessage(e) {
      return guard(() => ({ event: complete('user_message', e) }));
    },
    taskCompleted(e) {
      return guard(() => {
        const event = complete('task_completed', e);
        const key = taskKey(e);
        const accepted = () => {
          const before = steps.get(key);
          steps.delete(key);
          // A task whose end was not published goes on counting, unless a call has started it again since.
          return () => {
            if (before !== undefined && !steps.has(key)) steps.set(key, before);
          };
        };
        return { event, accepted };
      });
    },
    async flush() {
      await sendNow();
      report();
    },
    close() {
      // Every call gets the one closing: a second close() (a signal handler and the end of main() both
      // closing) resolved at once, before the first had sent the queue, and a process that exited on it lost
      // those events.
      closing ??= (async () => {
        closed = true;
        try {
          await sendNow();
        } finally {
          if (owned && connected) await producer.disconnect().catch(() => undefined);
        }
        report();
      })();
      return closing;
    },
  };
}
