import { afterEach, describe, expect, it } from 'vitest';
import { detectorRecord, flowNameOf } from '../detector-record.js';
import { groupCaughtUp, produce, unique, waitFor } from '../../../../test/helpers/kafka.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';
import {
  getJson,
  isReady,
  killAll,
  serviceEnv,
  startProcess,
  type Proc,
} from '../../../../test/helpers/process.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
afterEach(() => killAll(procs));

// 11 tau-bench-like tool names (DETECTOR_MAX_LENGTH defaults to 12): the detector's name is > 256 characters.
const LONG = [
  'get_user_details',
  'get_reservation_details',
  'search_direct_flight',
  'search_onestop_flight',
  'update_reservation_flights',
  'update_reservation_baggages',
  'update_reservation_passengers',
  'calculate',
  'book_reservation',
  'send_certificate',
  'transfer_to_human_agents',
];
// 300 distinct tools, no loop: 300 steps, past the 256 a flow may have, whatever is cut.
const TOO_MANY = Array.from({ length: 300 }, (_, i) => `tool_${i}`);

describe('promotion within the flows.v1 contract (real Kafka/Redis, the service process)', () => {
  it('auto promotion bounds a long name, refuses a flow that cannot be valid (pending, counted), and the service lives on', async () => {
    const env = serviceEnv({
      FLOWS_GROUP_ID: unique('fl'),
      PAVER_TOPIC_FLOWS: unique('flows'),
      FLOWS_PROMOTION: 'auto',
      FLOWS_SHADOW_TRIALS: '0',
      FLOWS_AUTO_MIN_OCCURRENCES: '1',
    });
    await createFlowsTopics(env, 1);
    const p = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(p);
    await waitFor(() => isReady(p), 'flows /readyz');
    const recs = [LONG, TOO_MANY, ['get_user_details', 'book_reservation']].map((t) =>
      detectorRecord(t, { agent: 'a', at: Date.now() }),
    );
    await produce(
      env.PAVER_TOPIC_FLOW_CANDIDATES!,
      recs.map((r) => ({ key: `default/a/${r.dedupe_key}`, value: JSON.stringify(r) })),
    );
    const flows = async () =>
      p.child.exitCode === null
        ? ((await getJson(p.url('/flows?agent_id=a'))).body as { name: string }[])
        : 'exited';
    await waitFor(
      async () => (await flows()) === 'exited' || (await flows()).length === 2,
      'two flows, or an exit',
    );
    // Before, the first candidate's flow failed the sink (INTERNAL): the process exited, and did again on restart.
    // The group commits a batch's offsets only once its effects are written, so every candidate committed means
    // every candidate's batch was handled through, not merely that two flows got out before a crash.
    await waitFor(
      async () =>
        p.child.exitCode !== null ||
        (await groupCaughtUp(env.FLOWS_GROUP_ID!, env.PAVER_TOPIC_FLOW_CANDIDATES!)),
      'every candidate handled (offsets committed), or an exit',
    );
    expect({ exit: p.child.exitCode, log: p.child.exitCode === null ? '' : p.output().slice(-600) }).toEqual({
      exit: null,
      log: '',
    });
    const names = (await flows()) as { name: string }[];
    expect(names.map((f) => f.name.length).sort((x, y) => x - y)).toEqual([
      flowNameOf(['get_user_details', 'book_reservation']).length,
      256,
    ]);
    const key = encodeURIComponent(recs[1]!.dedupe_key);
    const stored = await getJson(p.url(`/flows/candidates/${key}?agent_id=a`));
    expect((stored.body as { status: string }).status).toBe('pending');
    // Refusals are counted once the batch's write (and the publication of the flows seen above) is done.
    const refused = async () =>
      parsePrometheus(await (await fetch(p.url('/metrics'))).text()).value(
        'paver_flows_promotions_refused_total',
      );
    await waitFor(async () => (await refused()) >= 1, 'the refused promotion counted');
    const metrics = await (await fetch(p.url('/metrics'))).text();
    expect(metrics).toMatch(/^paver_flows_promotions_refused_total{service="flows"} 1$/m);
    // An operator's promote of it is refused as the request's fault (422), not a server error.
    const res = await fetch(p.url(`/flows/candidates/${key}/promote?agent_id=a`), { method: 'POST' });
    expect({ status: res.status, body: (await res.json()) as unknown }).toEqual({
      status: 422,
      body: {
        error: expect.stringMatching(/^this candidate cannot become a valid flow: steps: /) as unknown,
      },
    });
    expect(
      ((await getJson(p.url(`/flows/candidates/${key}?agent_id=a`))).body as { status: string }).status,
    ).toBe('pending');
    expect(p.child.exitCode).toBeNull();
  });
});
