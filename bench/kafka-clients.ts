/**
 * What a Kafka client swap behind shared/kafka/ would give the services that publish one record per input:
 * the bench's two baselines (a bare consumer: JSON.parse only; a bare pipe: JSON.parse and one produced record
 * per input, acks all, no compression) on each Node.js client installed, over one backlog, with the CPU this
 * process and the broker spent per event. Not part of `npm run bench`, and its clients are not dependencies:
 *
 *   npm i --no-save @platformatic/kafka@1.22.0                          # pure JavaScript
 *   apt-get install librdkafka-dev && BUILD_LIBRDKAFKA=0 npm i --no-save node-rdkafka@2.15.0   # librdkafka 2.0.2
 *   npm run build && KAFKA_BROKERS=host:port node dist/bench/kafka-clients.js     # e.g. from `npx paver stack`
 *
 * A client not installed is skipped. BENCH_EVENTS sets the backlog (default 200,000). Timed from the first message
 * received to the last one handled. Not equal in every respect: kafkajs runs its three partitions' batches
 * concurrently (as the services do); @platformatic/kafka's stream is taken 500 messages at a time and node-rdkafka's
 * 1,000 at a time, one batch after another.
 */
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { CompressionTypes, Kafka, logLevel } from 'kafkajs';

const brokers = process.env.KAFKA_BROKERS;
if (!brokers) throw new Error('set KAFKA_BROKERS (a local stack: npx paver stack)');
const N = Number(process.env.BENCH_EVENTS ?? 200_000);
const id = `clients-${Date.now().toString(36)}`;
const input = `${id}.in`;
const kafka = new Kafka({ clientId: 'paver-bench', brokers: [brokers], logLevel: logLevel.NOTHING });

/** The pid listening on KAFKA_BROKERS's port when the broker runs on this machine (`ss`), else null. */
const brokerPid = (() => {
  try {
    const port = brokers.split(',')[0]!.split(':').pop();
    const out = execFileSync('ss', ['-ltnpH', `sport = :${port}`], { encoding: 'utf8' });
    return /pid=(\d+)/.exec(out)?.[1] ?? null;
  } catch {
    return null;
  }
})();
const brokerCpuUs = (): number | null => {
  if (!brokerPid) return null;
  const f = readFileSync(`/proc/${brokerPid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) * (1e6 / 100);
};

interface Row {
  client: string;
  baseline: 'consumer' | 'pipe';
  events_per_s: number;
  cpu_us_per_event: number;
  broker_cpu_us_per_event: number | null;
}
const rows: Row[] = [];

type Mark = { t: bigint; c: NodeJS.CpuUsage; b: number | null };
const mark = (): Mark => ({ t: process.hrtime.bigint(), c: process.cpuUsage(), b: brokerCpuUs() });
/**
 * From the first message received to the last one handled: connecting, joining the group and leaving it are
 * left out (a fixed cost that would weigh most on the fastest runs). Each run calls `started` on its first
 * message and `finished` once the last one is handled.
 */
let first: Mark | null = null;
let last: Mark | null = null;
const started = () => {
  first ??= mark();
};
const finished = () => {
  last ??= mark();
};

async function measure(client: string, baseline: Row['baseline'], run: () => Promise<void>) {
  first = null;
  last = null;
  await run();
  const [w, e] = [first as Mark | null, last as Mark | null];
  if (!w || !e) throw new Error(`${client} ${baseline}: the run did not mark its first and last message`);
  const ms = Number(e.t - w.t) / 1e6;
  const c = { user: e.c.user - w.c.user, system: e.c.system - w.c.system };
  const b0 = w.b;
  const b1 = e.b;
  const row: Row = {
    client,
    baseline,
    events_per_s: Math.round(N / (ms / 1000)),
    cpu_us_per_event: Number(((c.user + c.system) / N).toFixed(2)),
    broker_cpu_us_per_event: b0 === null || b1 === null ? null : Number(((b1 - b0) / N).toFixed(2)),
  };
  rows.push(row);
  process.stderr.write(`${JSON.stringify(row)}\n`);
}

const piped = (value: string) => {
  const e = JSON.parse(value) as { session_id: string; event_id: string };
  return { key: e.session_id, value: JSON.stringify({ event_id: e.event_id, piped: true }) };
};

async function kafkajs() {
  const each = (group: string, fn: (values: string[]) => Promise<void>) =>
    new Promise<void>((resolve, reject) => {
      const c = kafka.consumer({ groupId: group });
      let n = 0;
      void (async () => {
        await c.connect();
        await c.subscribe({ topic: input, fromBeginning: true });
        await c.run({
          partitionsConsumedConcurrently: 3,
          eachBatch: async ({ batch }) => {
            started();
            await fn(batch.messages.map((m) => m.value!.toString()));
            n += batch.messages.length;
            if (n < N) return;
            finished();
            setImmediate(() => void c.disconnect().then(resolve, reject));
          },
        });
      })().catch(reject);
    });
  await measure('kafkajs', 'consumer', () =>
    each(`${id}-kjs-c`, async (vs) => {
      for (const v of vs) JSON.parse(v);
    }),
  );
  const p = kafka.producer();
  await p.connect();
  await measure('kafkajs', 'pipe', () =>
    each(`${id}-kjs-p`, async (vs) => {
      await p.send({
        topic: `${id}.out-kjs`,
        messages: vs.map(piped),
        acks: -1,
        compression: CompressionTypes.None,
      });
    }),
  );
  await p.disconnect();
}

/* eslint-disable @typescript-eslint/no-explicit-any -- optional clients, not installed with Paver */
async function optional(name: string): Promise<any> {
  try {
    return await import(name);
  } catch {
    process.stderr.write(`${name} is not installed: skipped\n`);
    return null;
  }
}

async function platformatic() {
  const m = await optional('@platformatic/kafka');
  if (!m) return;
  const each = async (group: string, fn: (values: string[]) => Promise<void>) => {
    const consumer = new m.Consumer({
      groupId: group,
      clientId: 'paver-bench',
      bootstrapBrokers: [brokers],
      deserializers: m.stringDeserializers,
      maxWaitTime: 100,
    });
    const stream = await consumer.consume({ autocommit: true, topics: [input], mode: 'earliest' });
    // Its stream yields one message at a time: taken 500 at a time, as a batch, paused while one is handled.
    await new Promise<void>((resolve, reject) => {
      let n = 0;
      let buf: string[] = [];
      let chain = Promise.resolve();
      stream.on('data', (msg: { value: string }) => {
        started();
        buf.push(msg.value);
        n++;
        if (buf.length < 500 && n < N) return;
        const take = buf;
        buf = [];
        stream.pause();
        const done = n >= N;
        chain = chain
          .then(() => fn(take))
          .then(() => {
            if (!done) return void stream.resume();
            finished();
            resolve();
          }, reject);
      });
      stream.on('error', reject);
    });
    await stream.close();
    await consumer.close();
  };
  await measure('@platformatic/kafka', 'consumer', () =>
    each(`${id}-plt-c`, async (vs) => {
      for (const v of vs) JSON.parse(v);
    }),
  );
  const p = new m.Producer({
    clientId: 'paver-bench',
    bootstrapBrokers: [brokers],
    serializers: m.stringSerializers,
    acks: -1,
  });
  await measure('@platformatic/kafka', 'pipe', () =>
    each(`${id}-plt-p`, async (vs) => {
      await p.send({ messages: vs.map((v) => ({ topic: `${id}.out-plt`, ...piped(v) })), acks: -1 });
    }),
  );
  await p.close();
}

async function rdkafka() {
  const mod = await optional('node-rdkafka');
  if (!mod) return;
  const K = mod.default ?? mod;
  const each = (group: string, fn: (values: string[]) => Promise<void>) =>
    new Promise<void>((resolve, reject) => {
      const c = new K.KafkaConsumer(
        { 'group.id': group, 'metadata.broker.list': brokers, 'enable.auto.commit': true },
        { 'auto.offset.reset': 'earliest' },
      );
      let n = 0;
      c.on('ready', () => {
        c.subscribe([input]);
        const next = () =>
          c.consume(1000, (err: Error | null, ms: { value: Buffer }[]) => {
            if (err) return reject(err);
            if (ms.length) started();
            void fn(ms.map((m) => m.value.toString())).then(() => {
              n += ms.length;
              if (n >= N) {
                finished();
                c.disconnect(() => resolve());
              } else setImmediate(next);
            }, reject);
          });
        next();
      });
      c.connect();
    });
  await measure('node-rdkafka', 'consumer', () =>
    each(`${id}-rdk-c`, async (vs) => {
      for (const v of vs) JSON.parse(v);
    }),
  );
  const p = new K.Producer({
    'metadata.broker.list': brokers,
    dr_cb: true,
    'request.required.acks': -1,
    // librdkafka's default linger (5 ms): without one, each record goes as its own request (tried: the broker then
    // spends 98 µs per record). Each batch waits for its acknowledgements before the next, as the sink's send
    // precedes a commit.
    'linger.ms': 5,
    'compression.codec': 'none',
  });
  await new Promise((r) => {
    p.on('ready', r);
    p.connect();
  });
  p.setPollInterval(1);
  let pending = 0;
  let drained: (() => void) | null = null;
  p.on('delivery-report', (err: Error | null) => {
    if (err) throw err;
    if (--pending === 0 && drained) drained();
  });
  await measure('node-rdkafka', 'pipe', () =>
    each(`${id}-rdk-p`, async (vs) => {
      for (const v of vs) {
        const r = piped(v);
        pending++;
        p.produce(`${id}.out-rdk`, null, Buffer.from(r.value), r.key);
      }
      // Acknowledged before the next batch, as the sink's send is before a commit.
      if (pending > 0) await new Promise<void>((r) => (drained = r));
      drained = null;
    }),
  );
  await new Promise((r) => p.disconnect(r));
}
/* eslint-enable @typescript-eslint/no-explicit-any */

const admin = kafka.admin();
await admin.connect();
await admin.createTopics({
  topics: [input, `${id}.out-kjs`, `${id}.out-plt`, `${id}.out-rdk`].map((topic) => ({
    topic,
    numPartitions: 3,
  })),
  waitForLeaders: true,
});
await admin.disconnect();
const producer = kafka.producer();
await producer.connect();
for (let i = 0; i < N; i += 5000) {
  const messages = [];
  for (let j = i; j < Math.min(N, i + 5000); j++) {
    const s = `s${j % 5000}`;
    const e = {
      type: 'tool_call',
      event_id: `${s}:${j}`,
      session_id: s,
      tool: 'web_search',
      args: { q: `q ${j}` },
    };
    messages.push({ key: s, value: JSON.stringify({ ...e, ts: Date.now(), tenant_id: 't', agent_id: 'a' }) });
  }
  await producer.send({ topic: input, messages });
}
await producer.disconnect();
await kafkajs();
await platformatic();
await rdkafka();
const bare = rows.find((r) => r.client === 'kafkajs' && r.baseline === 'consumer')!.events_per_s;
process.stdout.write(
  `${JSON.stringify({ events: N, rows: rows.map((r) => ({ ...r, ratio_to_kafkajs_consumer: Number((r.events_per_s / bare).toFixed(3)) })) }, null, 2)}\n`,
);
process.exit(0);
