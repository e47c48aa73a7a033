import { setTimeout as tick } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { consumeUntil, produce, testRedis, waitFor, type Consumed } from '../../../../test/helpers/kafka.js';
import { isReady, serviceEnv, type Proc } from '../../../../test/helpers/process.js';
import { flowCandidateRecordV1, type FlowCandidate } from '../../../../schemas/index.js';
import { agentEvents } from '../../../../testkit/streams.js';
import { candidateKey, toRecord } from '../../src/core/candidate.js';
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
 * Issue 12 item 4: Redis loss, survived. A 3-partition backlog is read by the detector (a real process);
 * mid-stream every detector key is deleted (what FLUSHALL or an empty Redis after a restart does to it,
 * without touching the other test files sharing this Redis). The detector must notice (epoch marker), say so
 * on /readyz while it replays each partition's window span from Kafka, and end with the candidates
 * `paver detect` gives over the same events.
 */
const TASKS = 600;
const events = withRequests([...agentEvents({ tasks: TASKS, seed: 23 })]);
let offline: OfflineCandidate[];

const redis = testRedis();
const procs: Proc[] = [];
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  redis.disconnect();
});

/** The candidates the topic holds as active (the latest record per key), sorted by dedupe_key. */
function activeOnTopic(all: Consumed[]): unknown[] {
  const latest = new Map<string, { status: string; dedupe_key: string; candidate: unknown }>();
  for (const m of all)
    if (m.key !== null && m.value !== null) latest.set(m.key, JSON.parse(m.value.toString()));
  return [...latest.values()]
    .filter((r) => r.status === 'active')
    .sort((a, b) => (a.dedupe_key < b.dedupe_key ? -1 : 1))
    .map((r) => r.candidate);
}
const byKey = (xs: { dedupe_key?: unknown }[]) =>
  [...xs].sort((a, b) => (String(a.dedupe_key) < String(b.dedupe_key) ? -1 : 1));

/**
 * Deletes every key under the prefix at once, as FLUSHALL does (atomically: one script), but only this
 * test's keys (other test files share this Redis).
 */
async function flushPrefix(prefix: string): Promise<number> {
  const n = await redis.eval(
    "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do n = n + redis.call('DEL', k) end return n",
    0,
    `${prefix}:*`,
  );
  return Number(n);
}

beforeAll(async () => {
  offline = await detectOffline(events);
});

describe('detector after a Redis loss (real Kafka, real Redis)', () => {
  it('notices the loss, is not ready while it replays, and ends with the candidates `paver detect` gives', async () => {
    expect(offline).toHaveLength(4);
    for (const c of offline) expect(c.occurrence_count).toBeGreaterThanOrEqual(8);

    const env = serviceEnv({
      ...PARAMS,
      PAVER_BATCH_CHUNK: '40',
      KAFKA_MAX_BYTES_PER_PARTITION: '16384',
      DETECTOR_CHECKPOINT_INTERVAL_MS: '0',
    });
    await detectorTopics(env, 3);
    // The loss comes mid-stream by construction: half the backlog before it, the rest after. With all of it
    // produced up front, the loss came once the sample below and the stale candidate's produce were done; a
    // detector that read the rest meanwhile (the whole backlog takes it seconds, and a starved test process can
    // take as long between the two) left a partition no next batch to notice the loss with, and the wait for
    // three rebuilds timed out (likely the failure seen once with the Redis-loss files run together).
    const send = (evs: typeof events) => sendEvents(env, evs);
    const half = Math.floor(events.length / 2);
    await send(events.slice(0, half));

    const p = await startDetector(env, procs);
    const before = await waitFor(async () => {
      const m = await metrics(p);
      return m.value('paver_detector_records_completed_total') >= 150 ? m : null;
    }, 'records before the loss');
    const rebuiltBefore = before.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' });
    const replayedBefore = before.value('paver_detector_rebuild_events_total');

    // Watch /readyz from before the loss until the rebuilds are over: it must go false, then true again.
    let sawNotReady = false;
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        if (!(await isReady(p))) sawNotReady = true;
        await tick(5);
      }
    })();
    // A candidate the detector published before the loss (as far as the topic knows) and that is not live
    // after it: its entry in the publication map is lost with Redis, yet it must still be retracted.
    const scope = { tenant: 'default', agent: 'agent-0' };
    const stale = {
      ...(offline[0] as FlowCandidate),
      tool_sequence: ['stale_a', 'stale_b', 'stale_c'],
      dedupe_key: 'flow_offload:stale_a>stale_b>stale_c',
    };
    await produce(env.PAVER_TOPIC_FLOW_CANDIDATES!, [
      {
        key: candidateKey(scope, stale.dedupe_key),
        value: JSON.stringify(flowCandidateRecordV1.parse(toRecord(stale, scope, Date.now()))),
      },
    ]);
    const t0 = Date.now();
    expect(await flushPrefix(env.REDIS_KEY_PREFIX!)).toBeGreaterThan(0);
    await send(events.slice(half));

    // Every partition is rebuilt (the loss is seen by each partition's next batch).
    const after = await waitFor(async () => {
      const m = await metrics(p);
      return m.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' }) >= rebuiltBefore + 3 &&
        m.value('paver_detector_rebuilding') === 0
        ? m
        : null;
    }, 'three partition rebuilds').catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output().slice(-4000)}`);
    });
    await waitFor(() => isReady(p), '/readyz true after the rebuild');
    const rebuildMs = Date.now() - t0;
    watching = false;
    await watcher;
    expect(sawNotReady).toBe(true);
    // The loss came mid-stream: the backlog was not done when the state went.
    expect(before.value('paver_detector_records_completed_total')).toBeLessThan(TASKS);
    const replayed = after.value('paver_detector_rebuild_events_total') - replayedBefore;
    expect(replayed, `rebuilds replayed nothing\n${p.output().slice(-6000)}`).toBeGreaterThan(0);

    await waitFor(
      async () => JSON.stringify(await candidates(p)) === JSON.stringify(offline),
      'live candidates equal to the offline run',
      120_000,
    ).catch(async (err: Error) => {
      throw new Error(
        `${err.message}\nlive: ${JSON.stringify(await candidates(p)).slice(0, 2000)}\n${p.output().slice(-4000)}`,
      );
    });
    expect(await candidates(p)).toEqual(offline);
    // The topic agrees: what it holds as active (latest record per key) is exactly the offline answer, so
    // nothing published before the loss was left behind unretracted.
    const want = JSON.stringify(byKey(offline as { dedupe_key?: unknown }[]));
    const topic = await consumeUntil(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      (all) => JSON.stringify(activeOnTopic(all)) === want,
    ).catch((err: Error) => {
      throw new Error(`${err.message}
${p.output().slice(-3000)}`);
    });
    expect(activeOnTopic(topic)).toEqual(byKey(offline as { dedupe_key?: unknown }[]));
    const m = await metrics(p);
    expect(m.value('paver_dead_letters_total')).toBe(0);
    expect(p.output()).toContain('detector partition state rebuilt from Kafka');
    expect(p.output()).toContain('publication state restored from the flow-candidates topic');
    if (process.env.PAVER_TEST_FIGURES)
      console.log(
        'redis loss scenario',
        JSON.stringify({
          events: events.length,
          recordsBeforeLoss: before.value('paver_detector_records_completed_total'),
          replayedAfterLoss: replayed,
          rebuildMs,
          rebuilds: m.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' }),
          duplicate: m.value('paver_detector_events_ignored_total', { reason: 'duplicate' }),
          late: m.value('paver_detector_events_ignored_total', { reason: 'late' }),
          offline: offline.map((c) => c.occurrence_count),
        }),
      );
  }, 300_000);
});
