import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../../../../test/helpers/kafka.js';
import { serviceEnv, type Proc } from '../../../../test/helpers/process.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { withRequests } from '../reference/requests.js';
import {
  candidates,
  detectOffline,
  detectorTopics,
  metrics,
  PARAMS,
  sendEvents,
  startDetector,
  type OfflineCandidate,
} from './backlog.js';

/**
 * Issue 12: the result must not depend on how partitions interleave or on restarts. A backlog on 3
 * partitions is read in partition-sized fetches, so one partition runs ahead of the others in event time;
 * with a short idle limit, a single clock per scope cut the other partitions' open tasks (and ignored the
 * rest of them). The detector is SIGKILLed twice mid-stream; the final candidates must equal `paver detect`.
 */
const TASKS = 600;
const events = withRequests([...agentEvents({ tasks: TASKS, seed: 11 })]);
let offline: OfflineCandidate[];

const procs: Proc[] = [];
afterAll(() => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
});

beforeAll(async () => {
  offline = await detectOffline(events);
});

describe('detector across partitions and restarts (real Kafka, real Redis)', () => {
  it('a 3-partition backlog, SIGKILLed twice mid-stream, gives the candidates `paver detect` gives', async () => {
    // The offline answer is a real one: four of the stream's workflows, each seen many times, with terms.
    expect(offline).toHaveLength(4);
    for (const c of offline) {
      expect(c.occurrence_count).toBeGreaterThanOrEqual(8);
      expect(c.request_terms!.tasks).toBeGreaterThanOrEqual(8);
    }
    expect(offline.map((c) => c.tool_sequence.join('>'))).toContain(
      'file_read>validate_yaml>file_write>bash_execute',
    );

    const env = serviceEnv({ ...PARAMS, PAVER_BATCH_CHUNK: '40', KAFKA_MAX_BYTES_PER_PARTITION: '16384' });
    await detectorTopics(env, 3, { checkpoints: false });
    // The whole stream is a backlog before the detector starts, keyed by session as agents publish it.
    await sendEvents(env, events);

    const done: number[] = [];
    for (let kill = 0; kill < 2; kill++) {
      const p = await startDetector(env, procs);
      const n = await waitFor(
        async () => {
          const v = (await metrics(p)).value('paver_detector_records_completed_total');
          return v >= 100 ? v : 0;
        },
        `records before kill ${kill + 1}`,
      ).catch((err: Error) => {
        throw new Error(`${err.message}\n${p.output().slice(-4000)}`);
      });
      p.child.kill('SIGKILL');
      await p.exited;
      done.push(n);
    }
    // Both kills came mid-stream: together they had not completed every task.
    expect(done[0]! + done[1]!).toBeLessThan(TASKS);

    const last = await startDetector(env, procs);
    await waitFor(
      async () => JSON.stringify(await candidates(last)) === JSON.stringify(offline),
      'live candidates equal to the offline run',
      120_000,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\nlive: ${JSON.stringify(await candidates(last)).slice(0, 2000)}`);
    });
    expect(await candidates(last)).toEqual(offline);
    const m = await metrics(last);
    expect(m.value('paver_dead_letters_total')).toBe(0);
    if (process.env.PAVER_TEST_FIGURES)
      console.log(
        'partitions scenario',
        JSON.stringify({
          events: events.length,
          killedAfterRecords: done,
          lastProcess: {
            completed: m.value('paver_detector_records_completed_total'),
            duplicate: m.value('paver_detector_events_ignored_total', { reason: 'duplicate' }),
            late: m.value('paver_detector_events_ignored_total', { reason: 'late' }),
          },
          offline: offline.map((c) => c.occurrence_count),
        }),
      );
  }, 300_000);
});
