import { spawn } from 'node:child_process';
import { appendFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { freePort } from '../../deploy/local/stack.js';
import { consumeUntil, createTopics, unique, waitFor } from '../helpers/kafka.js';
import { PAVER_BIN, ROOT, serviceEnv, startProcess } from '../helpers/process.js';
import { startRegistryDouble } from '../helpers/registry-double.js';
import { WIRE_HEADER_BYTES } from '../../shared/codec.js';

const input = join(tmpdir(), `${unique('publish')}.jsonl`);
// Written with a byte order mark, as some Windows tools do: the first event is still read as one.
writeFileSync(
  input,
  [
    '\ufeff' +
      JSON.stringify({ type: 'tool_call', event_id: 'a', session_id: 's1', tenant_id: 'old', tool: 'x' }),
    'not json',
    JSON.stringify({ type: 'tool_call', event_id: 'b', session_id: 's2', tool: 'y' }),
    `{"type":"tool_call","event_id":"c","session_id":"s3","tool":"z","args":{"a":${'['.repeat(300)}${']'.repeat(300)}}}`,
    '',
  ].join('\n'),
);
const run = async (args: string[], env: Record<string, string>) => {
  const p = await startProcess([PAVER_BIN, 'publish', '--input', input, ...args], env);
  const code = await p.exited;
  return { code, out: p.output() };
};

/** A service environment without REDIS_URL: publish needs only Kafka. */
const kafkaOnlyEnv = () => {
  const { REDIS_URL: _unused, ...env } = serviceEnv();
  return env;
};

/** The event_id of each consumed record, in the order read. */
const eventIds = (all: { value: Buffer | null }[]) =>
  all.map((m) => (JSON.parse(m.value!.toString()) as { event_id: string }).event_id);

/** One tool call of session 's', as a line of publish's input (without its newline). */
const liveLine = (id: string, more: Record<string, unknown> = {}) =>
  JSON.stringify({
    type: 'tool_call',
    event_id: id,
    session_id: 's',
    task_id: 't',
    step: 0,
    tool: 'x',
    ts: 1,
    ...more,
  });

/** A tool call of session 's1' with `observation` (left out when undefined), as a line of an input file. */
const fileLine = (id: string, observation?: string) =>
  JSON.stringify({ type: 'tool_call', event_id: id, session_id: 's1', tool: 'x', observation });

/**
 * `paver publish --input -` on a live stdin: a pipe, which Node makes a socket pair, as a program's child process
 * gets it. Its stderr is kept; `exited` gives its exit code and signal; `kill` ends it if it still runs.
 */
function publishFromStdin(env: Record<string, string>) {
  const p = spawn(process.execPath, [PAVER_BIN, 'publish', '--input', '-'], {
    cwd: ROOT,
    env,
    stdio: ['pipe', 'ignore', 'pipe'],
  });
  let err = '';
  p.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<[number | null, NodeJS.Signals | null]>((r) =>
    p.once('exit', (c, s) => r([c, s])),
  );
  const kill = () => {
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  };
  return { p, err: () => err, exited, kill };
}

/** `paver publish --input file` run to its end, which must be exit 0; `node` are Node's own flags. */
async function publishFile(file: string, env = serviceEnv(), node: string[] = []) {
  const p = await startProcess([...node, PAVER_BIN, 'publish', '--input', file], env);
  expect(await p.exited, p.output().slice(-2000)).toBe(0);
  return { out: p.output(), topic: env.PAVER_TOPIC_TOOL_CALLS! };
}

/**
 * Publishes `file` of three lines, the second over PAVER_MAX_MESSAGE_BYTES, which publish must say it skipped,
 * sending the two others: resolves the event ids read back from the topic.
 */
async function idsWithLine2Skipped(file: string, node: string[] = []) {
  const { out, topic } = await publishFile(file, serviceEnv(), node);
  expect(out).toContain('line 2: longer than PAVER_MAX_MESSAGE_BYTES');
  expect(out).toContain('published 2 events');
  return eventIds(await consumeUntil(topic, (all) => all.length >= 2));
}

describe('paver publish', () => {
  it('needs only KAFKA_BROKERS, and --tenant/--agent set tenant_id/agent_id on every event', async () => {
    const env = kafkaOnlyEnv();
    const r = await run(['--tenant', 'acme', '--agent', 'bot-1'], env);
    expect(r.code).toBe(0);
    expect(r.out).toContain(
      'line 4: nested deeper than 256 levels; sent as is, and the services dead-letter it',
    );
    expect(r.out).toContain('published 4 events');
    const got = await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => all.length >= 4);
    const events = got.map((m) => m.value!.toString()).filter((v) => v.startsWith('{'));
    expect(
      events
        .map((v) => JSON.parse(v) as Record<string, string>)
        .map((e) => [e.event_id, e.tenant_id, e.agent_id])
        .sort(),
    ).toEqual([
      ['a', 'acme', 'bot-1'],
      ['b', 'acme', 'bot-1'],
      ['c', undefined, undefined], // as it was written: too deep to rewrite
    ]);
  });

  it('exits 78 with one line on bad configuration', async () => {
    const r = await run([], { PATH: process.env.PATH ?? '', LOG_LEVEL: 'loud' });
    expect(r.code).toBe(78);
    expect(r.out.trim().split('\n')).toHaveLength(1);
    expect(r.out).toContain('KAFKA_BROKERS: is required');
    expect(r.out).toContain('LOG_LEVEL');
    const bad = await run(['--tenant', 'a\tb'], {
      PATH: process.env.PATH ?? '',
      KAFKA_BROKERS: '127.0.0.1:1',
    });
    // A bad flag is a usage error, not a bad environment.
    expect(bad.code).toBe(2);
    expect(bad.out).toContain('--tenant');
  });

  it('names a --topic the broker does not have, instead of its protocol error', async () => {
    const env = kafkaOnlyEnv();
    const topic = unique('publish-missing'); // never created; the test broker creates no topic on its own
    const r = await run(['--topic', topic], env);
    expect(r.code).toBe(1);
    // Before: 'failed after 0 events: This server does not host this topic-partition'.
    expect(r.out).toContain(`topic '${topic}' does not exist`);
  });

  it("--input - reads a stdin that is a socket, as a program's child process gets from Node", async () => {
    const env = kafkaOnlyEnv();
    // stdio 'pipe' is a socket pair: opening /dev/stdin failed on it with ENXIO (exit 1, nothing sent).
    const { p, err, exited } = publishFromStdin(env);
    p.stdin.end(`${liveLine('sock-1')}\n`);
    const [code] = await exited;
    expect(code, err()).toBe(0);
    expect(err()).toContain('published 1 events');
    const got = await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => all.length >= 1);
    expect(got.map((m) => m.key)).toEqual(['s']);
  });

  it('sends the lines of a live stdin as they come, not only once 500 have gathered or the input ends', async () => {
    const env = kafkaOnlyEnv();
    await createTopics([{ topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 }]);
    const { p, err, exited, kill } = publishFromStdin(env);
    try {
      p.stdin.write(`${liveLine('live-1')}\n`);
      p.stdin.write(`${liveLine('live-2')}\n`);
      // stdin stays open, as a tail -f into publish keeps it. Before: nothing was sent until 500 lines or the
      // end of the input, and a Ctrl-C lost them all.
      const got = await consumeUntil(env.PAVER_TOPIC_TOOL_CALLS!, (all) => all.length >= 2, 60_000);
      expect(eventIds(got)).toEqual(['live-1', 'live-2']);
      p.stdin.end(`${liveLine('live-3')}\n`);
      const [code] = await exited;
      expect(code).toBe(0);
      expect(err()).toContain('published 3 events');
    } finally {
      kill();
    }
  });

  it.each(['SIGINT', 'SIGTERM'] as const)(
    '%s sends the lines of a live stdin already read, prints the summary, and ends by the signal',
    async (signal) => {
      const env = kafkaOnlyEnv();
      const topic = env.PAVER_TOPIC_TOOL_CALLS!;
      await createTopics([{ topic, partitions: 1 }]);
      const { p, err, exited, kill } = publishFromStdin(env);
      const write = (text: string) =>
        new Promise<void>((resolve, reject) => p.stdin.write(text, (e) => (e ? reject(e) : resolve())));
      try {
        // The first line on the topic says that publish is reading.
        await write(`${liveLine('sig-1')}\n`);
        await consumeUntil(topic, (all) => all.length >= 1, 60_000);
        // Three lines, and the start of a fourth, in publish's input when the signal comes: the lines within the
        // 50 ms publish lingers for more, the cut line never finished by its writer.
        await write(
          `${liveLine('sig-2')}\n${liveLine('sig-3')}\n${liveLine('sig-4')}\n${liveLine('cut').slice(0, 30)}`,
        );
        p.kill(signal);
        // Before: killed by the signal at once, the lingering lines lost and no summary.
        const [code, by] = await exited;
        expect([code, by], err()).toEqual([null, signal]); // a shell says 130 (SIGINT) or 143 (SIGTERM)
        expect(err()).toContain(`published 4 events to ${topic} (stopped by ${signal})`);
        expect(err()).toContain('line 5: cut short by the stop; not sent');
        const got = await consumeUntil(topic, (all) => all.length >= 4, 60_000);
        expect(eventIds(got)).toEqual(['sig-1', 'sig-2', 'sig-3', 'sig-4']);
      } finally {
        kill();
      }
    },
  );

  it('a live stdin whose send fails ends the command with the error, not later lines dropped without a word', async () => {
    const env = kafkaOnlyEnv();
    // The broker refuses a record over this topic's max.message.bytes: the send the 50 ms timer starts fails.
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1, config: { 'max.message.bytes': '2000' } },
    ]);
    const { p, err, kill } = publishFromStdin(env);
    try {
      p.stdin.write(`${liveLine('too-big', { output: 'x'.repeat(5000) })}\n`);
      p.stdin.write(`${liveLine('after', { output: '' })}\n`);
      // stdin stays open (a tail -f). Before: the failure was swallowed, every later line chained onto the failed
      // send and was dropped, and the command went on reading, saying nothing.
      await waitFor(
        () => p.exitCode !== null || p.signalCode !== null,
        'publish to exit after its send failed',
        60_000,
      );
      expect(p.exitCode).toBe(1);
      expect(err()).toContain('failed after 0 events');
    } finally {
      kill();
    }
  });

  it('exits 69 with one clear line when no broker answers', async () => {
    const port = await freePort();
    const r = await run([], { PATH: process.env.PATH ?? '', KAFKA_BROKERS: `127.0.0.1:${port}` });
    expect(r.code).toBe(69);
    expect(r.out.trim().split('\n')).toHaveLength(1);
    expect(r.out).toContain(`no Kafka broker answered at 127.0.0.1:${port}`);
  });

  it('skips a line over PAVER_MAX_MESSAGE_BYTES as it streams by, never holding it whole', async () => {
    const big = join(tmpdir(), `${unique('publish-big')}.jsonl`);
    writeFileSync(big, fileLine('a') + '\n');
    const mib = Buffer.alloc(1024 * 1024, 'x');
    for (let i = 0; i < 256; i++) appendFileSync(big, mib);
    appendFileSync(
      big,
      '\n' + JSON.stringify({ type: 'tool_call', event_id: 'b', session_id: 's2', tool: 'y' }) + '\n',
    );
    // A 64 MiB heap: before, readline held the 256 MiB line whole and the process ran out of memory.
    expect((await idsWithLine2Skipped(big, ['--max-old-space-size=64'])).sort()).toEqual(['a', 'b']);
  });

  it('skips a line whose characters are under PAVER_MAX_MESSAGE_BYTES but whose bytes are over it, and sends the rest', async () => {
    const file = join(tmpdir(), `${unique('publish-wide-chars')}.jsonl`);
    // 400,000 characters of 3 bytes each: 1.2 MB, more than the broker takes in a record batch.
    writeFileSync(
      file,
      [fileLine('a'), fileLine('big', '€'.repeat(400_000)), fileLine('b')].join('\n') + '\n',
    );
    // Before: the broker refused the record, and the command failed (exit 1) with the lines after it unsent.
    expect(await idsWithLine2Skipped(file)).toEqual(['a', 'b']);
  });

  it('skips a line whose value is under PAVER_MAX_MESSAGE_BYTES but whose Kafka record is over it (key and framing), and sends the rest', async () => {
    const file = join(tmpdir(), `${unique('publish-framing')}.jsonl`);
    // 20 bytes under 1 MiB as text: the record batch it goes in (61 bytes of framing, the key) is over it.
    const big = fileLine('big', 'x'.repeat(1024 * 1024 - 20 - fileLine('big', '').length));
    expect(Buffer.byteLength(big)).toBe(1024 * 1024 - 20);
    writeFileSync(file, [fileLine('a'), big, fileLine('b')].join('\n') + '\n');
    // Before: the broker refused the record, and the command failed (exit 1) with the lines after it unsent.
    expect(await idsWithLine2Skipped(file)).toEqual(['a', 'b']);
  });

  it("sends each line's own bytes: numbers, key order, escapes and spacing as the user wrote them", async () => {
    const file = join(tmpdir(), `${unique('publish-bytes')}.jsonl`);
    // Valid events (the registry checks them), each of which changes when parsed and written again: an id past 2^53, 1.0 and 1e3, integer-like keys
    // (JSON.stringify puts them first), a \u escape, spaces after the colons.
    const lines = [
      '{"type":"tool_call","event_id":"a","session_id":"s1","task_id":"t","step":0,"ts":1,"tool":"x","args":{"order_id":12345678901234567890,"ratio":1.0,"limit":1e3}}',
      '{"type":"tool_call","event_id":"b","session_id":"s1","task_id":"t","step":1,"ts":2,"tool":"y","args":{"b":1,"2":"two","1":"one"}}',
      '{"type": "tool_call", "event_id": "c", "session_id": "s1", "task_id": "t", "step": 2, "ts": 3, "tool": "caf\\u00e9"}',
    ];
    writeFileSync(file, lines.join('\r\n') + '\r\n');
    const { topic } = await publishFile(file);
    const got = await consumeUntil(topic, (all) => all.length >= 3);
    // Before: {"order_id":12345678901234567000,"ratio":1,"limit":1000}, {"1":"one","2":"two","b":1}, "café".
    expect(got.map((m) => m.value!.toString())).toEqual(lines);
    expect(got.map((m) => m.key?.toString())).toEqual(['s1', 's1', 's1']);
    // In the Confluent wire format too: the registry's framing, then the line.
    const reg = await startRegistryDouble();
    try {
      const q = await publishFile(file, serviceEnv({ SCHEMA_REGISTRY_URL: reg.url }));
      const framed = await consumeUntil(q.topic, (all) => all.length >= 3);
      expect(framed.map((m) => m.value![0])).toEqual([0, 0, 0]);
      expect(framed.map((m) => m.value!.subarray(WIRE_HEADER_BYTES).toString())).toEqual(lines);
    } finally {
      await reg.close();
    }
  });

  it("sends 500 events of one session with 3 KB outputs (1.5 MB for one partition, over the broker's request limit)", async () => {
    const file = join(tmpdir(), `${unique('publish-wide')}.jsonl`);
    const text = 'x'.repeat(3000);
    writeFileSync(
      file,
      Array.from({ length: 500 }, (_, i) =>
        JSON.stringify({
          type: 'tool_call',
          event_id: `e${i}`,
          session_id: 's1',
          task_id: 't1',
          step: i,
          tool: 'read',
          observation: { text },
        }),
      ).join('\n') + '\n',
    );
    const { out, topic } = await publishFile(file);
    expect(out).toContain('published 500 events');
    const got = await consumeUntil(topic, (all) => all.length >= 500);
    // In file order: one session, one partition.
    expect(eventIds(got)).toEqual(Array.from({ length: 500 }, (_, i) => `e${i}`));
  });
});
