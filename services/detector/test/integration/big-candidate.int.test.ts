import { afterAll, describe, expect, it } from 'vitest';
import { consumeUntil, createTopics, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

/**
 * Default parameters (DETECTOR_MAX_TASK_EVENTS 1000, PAVER_MAX_OUTPUT_BYTES 1,000,000). Three runs of the same
 * 1000-step task with 64-character tool names (valid: tool names may be 256): the whole record is the top
 * candidate, and its flow-candidates record (steps twice, the flow name five times) is over 1 MB. It used to
 * be sent as a record that must not be left out: the sink failed the send as INTERNAL, the process exited, and
 * again after every restart (the change stays owed). Valid input must not stop the consumer.
 */
describe('a candidate whose record is over PAVER_MAX_OUTPUT_BYTES (real Kafka and Redis)', () => {
  it("is left out and counted; the scope's other candidates are published and the detector goes on", async () => {
    const env = serviceEnv({});
    await createTopics([
      { topic: env.PAVER_TOPIC_TOOL_CALLS! },
      { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
      { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
    ]);
    const tools = Array.from({ length: 1000 }, (_, i) => `mcp_server_${i}_`.padEnd(64, 'x'));
    const events: { key: string; value: string }[] = [];
    for (let t = 0; t < 3; t++) {
      const session = `s${t}`;
      const base = 1_700_000_000_000 + t * 10_000;
      tools.forEach((tool, i) =>
        events.push({
          key: session,
          value: JSON.stringify({
            type: 'tool_call',
            event_id: `t${t}-${i}`,
            ts: base + i,
            session_id: session,
            task_id: `task-${t}`,
            step: i,
            tool,
          }),
        }),
      );
      events.push({
        key: session,
        value: JSON.stringify({
          type: 'task_completed',
          event_id: `t${t}-done`,
          ts: base + 2000,
          session_id: session,
          task_id: `task-${t}`,
        }),
      });
    }
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, events);
    const p = await startProcess(['bin/paver.js', 'run', 'detector'], { ...env, DETECTOR_MAX_AHEAD_MS: '0' });
    procs.push(p);
    await waitFor(
      async () => {
        if (p.child.exitCode !== null)
          throw new Error(`detector exited ${p.child.exitCode}\n${p.output().slice(-1500)}`);
        if (!(await isReady(p))) return false;
        const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
        return m.value('paver_detector_records_completed_total') >= 3;
      },
      'the three records applied',
      90_000,
    );
    const c = (await getJson(p.url('/candidates?tenant_id=default&agent_id=default'))).body as unknown[];
    expect(c.length).toBeGreaterThan(0);
    await waitFor(
      async () => {
        if (p.child.exitCode !== null)
          throw new Error(`detector exited ${p.child.exitCode}\n${p.output().slice(-1500)}`);
        const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
        return m.value('paver_outputs_oversize_total', { outcome: 'dropped' }) >= 1;
      },
      'the oversized candidate left out',
      90_000,
    );
    // The detector goes on: a short pattern repeated afterwards is published.
    const short: { key: string; value: string }[] = [];
    for (let t = 0; t < 3; t++)
      ['a', 'b', 'c', null].forEach((tool, i) =>
        short.push({
          key: `q${t}`,
          value: JSON.stringify(
            tool === null
              ? {
                  type: 'task_completed',
                  event_id: `q${t}-done`,
                  ts: 1_700_000_100_000 + t * 10,
                  session_id: `q${t}`,
                  task_id: `q${t}`,
                }
              : {
                  type: 'tool_call',
                  event_id: `q${t}-${i}`,
                  ts: 1_700_000_100_000 + t * 10 + i,
                  session_id: `q${t}`,
                  task_id: `q${t}`,
                  step: i,
                  tool,
                },
          ),
        }),
      );
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, short);
    const got = await consumeUntil(env.PAVER_TOPIC_FLOW_CANDIDATES!, (all) =>
      all.some(
        (m) =>
          (JSON.parse(m.value!.toString()) as { dedupe_key: string }).dedupe_key === 'flow_offload:a→b→c',
      ),
    );
    for (const m of got) expect(m.value!.length).toBeLessThan(1_000_000);
    expect(p.child.exitCode, p.output().slice(-1500)).toBe(null);
  }, 180_000);
});
