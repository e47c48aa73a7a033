import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testRedis, waitFor } from '../../../../test/helpers/kafka.js';
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
 * An upgrade over state of an older layout (an earlier version of the detector wrote it, with the same parameters),
 * met mid-stream by a running detector (a real process, 3 partitions): every scope's state holds every partition's
 * part, so the detector must rebuild all partitions, not the one whose batch met it, and end with the candidates
 * `paver detect` gives. Before, the batch was refused as another epoch's state, the partition (already rebuilt in
 * this epoch) was not rebuilt again, and the batch was refused until the process gave up: its partitions stalled.
 */
const TASKS = 400;
const events = withRequests([...agentEvents({ tasks: TASKS, seed: 29 })]);
let offline: OfflineCandidate[];

const redis = testRedis();
const procs: Proc[] = [];
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  redis.disconnect();
});

beforeAll(async () => {
  offline = await detectOffline(events);
});

describe('detector meeting state of an older layout (real Kafka, real Redis)', () => {
  it('rebuilds every partition under a new epoch and ends with the candidates `paver detect` gives', async () => {
    expect(offline.length).toBeGreaterThan(0);
    const env = serviceEnv({
      ...PARAMS,
      PAVER_BATCH_CHUNK: '40',
      KAFKA_MAX_BYTES_PER_PARTITION: '16384',
      DETECTOR_CHECKPOINT_INTERVAL_MS: '0',
    });
    await detectorTopics(env, 3);
    const send = (evs: typeof events) => sendEvents(env, evs);
    const half = Math.floor(events.length / 2);
    await send(events.slice(0, half));
    const p = await startDetector(env, procs);
    // The first half is applied: every partition has been built in this epoch.
    await waitFor(async () => {
      const m = await metrics(p);
      return m.value('paver_detector_events_total', { outcome: 'applied' }) +
        m.value('paver_detector_events_total', { outcome: 'ignored' }) >=
        half
        ? m
        : null;
    }, 'the first half applied');
    const before = await metrics(p);
    const rebuiltBefore = before.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' });

    // What an earlier version left: every scope's state stamped with an older layout of the same parameters.
    const metas: string[] = [];
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(
        cursor,
        'MATCH',
        `${env.REDIS_KEY_PREFIX!}:det:*:meta`,
        'COUNT',
        1000,
      );
      cursor = next;
      metas.push(...keys);
    } while (cursor !== '0');
    expect(metas.length).toBeGreaterThan(0);
    const cfg = (await redis.hget(metas[0]!, 'cfg'))!;
    const older = cfg.replace(/\|v\d+$/, '|v3');
    expect(older).not.toBe(cfg);
    for (const k of metas) {
      expect(await redis.hget(k, 'cfg')).toBe(cfg);
      await redis.hset(k, 'cfg', older);
    }
    await send(events.slice(half));

    await waitFor(async () => {
      const m = await metrics(p);
      return m.value('paver_detector_rebuilds_total', { outcome: 'rebuilt' }) >= rebuiltBefore + 3 &&
        m.value('paver_detector_rebuilding') === 0
        ? m
        : null;
    }, 'three partition rebuilds').catch((err: Error) => {
      throw new Error(`${err.message}\n${p.output().slice(-4000)}`);
    });
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
    // No state of the older layout is left: each scope was cleared and rebuilt under the current one.
    for (const k of metas) expect(await redis.hget(k, 'cfg')).toBe(cfg);
    expect(p.output()).toContain('detector state of an older layout');
    expect(p.child.exitCode).toBeNull();
    expect((await metrics(p)).value('paver_dead_letters_total')).toBe(0);
  }, 300_000);
});
