import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { Partitioners } from 'kafkajs';
import { createCodec } from '../shared/codec.js';
import { commonEnvSchema, parseEnv } from '../shared/config.js';
import { createKafka } from '../shared/kafka/client.js';
import { ensureTopics, paverTopics } from '../shared/kafka/topics.js';
import { createLogger } from '../shared/log.js';

/**
 * `paver publish --input FILE.jsonl`: sends each line to the tool-calls topic keyed by its session_id, as an
 * agent runtime would. Lines are sent as they are (the services validate and dead-letter bad ones).
 */
export async function publish(opts: {
  input: string;
  topic?: string;
  env?: NodeJS.ProcessEnv;
}): Promise<number> {
  const env = parseEnv(commonEnvSchema, opts.env ?? process.env);
  const log = createLogger('publish', env.LOG_LEVEL === 'info' ? 'warn' : env.LOG_LEVEL);
  const kafka = createKafka(env, log, `${env.KAFKA_CLIENT_ID}-publish`);
  const topic = opts.topic ?? env.PAVER_TOPIC_TOOL_CALLS;
  const admin = kafka.admin();
  await admin.connect();
  await ensureTopics(admin, paverTopics(env), {
    partitions: env.KAFKA_TOPIC_PARTITIONS,
    replicationFactor: env.KAFKA_REPLICATION_FACTOR,
  });
  await admin.disconnect();
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  const codec = createCodec(env);
  let sent = 0;
  let batch: { key: string | null; value: Buffer }[] = [];
  const flush = async () => {
    if (batch.length === 0) return;
    await producer.send({ topic, messages: batch, acks: -1 });
    sent += batch.length;
    batch = [];
  };
  const rl = createInterface({ input: createReadStream(opts.input), crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    let key: string | null = null;
    let value: Buffer = Buffer.from(line);
    try {
      const obj = JSON.parse(line) as { session_id?: unknown };
      if (typeof obj.session_id === 'string') key = obj.session_id;
      value = await codec.encode('tool-calls.v1', topic, obj);
    } catch {
      // Not JSON: sent as is, so the services' dead-letter path can be seen working.
    }
    batch.push({ key, value });
    if (batch.length >= 500) await flush();
  }
  await flush();
  await producer.disconnect();
  process.stderr.write(`published ${sent} events to ${topic}\n`);
  return 0;
}
