import { afterAll, describe, expect, it } from 'vitest';
import { createTopics, groupCaughtUp, produce, unique, waitFor } from '../helpers/kafka.js';
import { getJson, killAll, serviceEnv, startReady, type Proc } from '../helpers/process.js';
import { parsePrometheus } from '../helpers/prometheus.js';

const procs: Proc[] = [];
afterAll(() => killAll(procs));

/*
 * The tool-calls topic is keyed by session_id: the services keep per-session order and per-partition state (the
 * detector's task clocks, the sequencer's sessions), which hold only when a session's events share a partition.
 * Before, a producer keying by another field (or by nothing) broke that without a trace.
 */
describe('input records not keyed as the contract asks (real Kafka and Redis, a real service)', () => {
  it('are processed, and counted in paver_input_key_mismatches_total', async () => {
    const env = serviceEnv({ SEQUENCER_GROUP_ID: unique('seq-keys') });
    const topic = env.PAVER_TOPIC_TOOL_CALLS!;
    await createTopics([{ topic, partitions: 2 }]);
    const p = await startReady(['bin/paver.js', 'run', 'sequencer'], env, procs);
    const event = (i: number) =>
      JSON.stringify({
        type: 'tool_call',
        event_id: `e${i}`,
        ts: 1_700_000_000_000 + i,
        session_id: `s${i % 3}`,
        task_id: `t${i % 3}`,
        step: Math.floor(i / 3),
        tool: 'search',
      });
    // Keyed by session_id, by the task id (the same text as no session here), by an event id, and by nothing.
    const keys = ['s0', 's1', 's2', 's0', 't1', 's2', 'e6', 's1', null];
    await produce(
      topic,
      keys.map((key, i) => ({ key, value: event(i) })),
    );
    const m = await waitFor(async () => {
      if (!(await groupCaughtUp(env.SEQUENCER_GROUP_ID!, topic))) return null;
      const m = parsePrometheus(String((await getJson(p.url('/metrics'))).body));
      return m.value('paver_events_consumed_total', { topic, outcome: 'processed' }) === keys.length
        ? m
        : null;
    }, 'every record processed');
    expect(m.value('paver_input_key_mismatches_total', { topic })).toBe(3);
    expect(p.output()).toMatch(/not keyed as the contract asks/);
    // Counts, never the keys or session ids themselves.
    expect(p.output()).not.toMatch(/"e6"|"t1"/);
  });
});
