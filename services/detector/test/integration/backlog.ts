import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';
import { createTopics, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { getJson, isReady, startProcess, type Proc } from '../../../../test/helpers/process.js';
import { parsePrometheus } from '../../../../test/helpers/prometheus.js';

/**
 * What the backlog scenarios (partitions and restarts, Redis loss) share: the detector's parameters, the
 * offline answer `paver detect` gives with them, and a detector process to compare with it.
 */
export const IDLE_MS = '300';
export const PARAMS = {
  DETECTOR_LOOKBACK: '80',
  DETECTOR_MAX_CANDIDATES: '4',
  DETECTOR_TASK_IDLE_MS: IDLE_MS,
};

export type OfflineCandidate = {
  tool_sequence: string[];
  occurrence_count: number;
  request_terms?: { tasks: number };
};

/** `paver detect` over `events` with PARAMS: the candidates the live detector must end with. */
export async function detectOffline(events: unknown[]): Promise<OfflineCandidate[]> {
  const file = join(mkdtempSync(join(tmpdir(), 'paver-det-backlog-')), 'events.jsonl');
  writeFileSync(file, events.map((e) => JSON.stringify(e)).join('\n') + '\n');
  const p = await startProcess(
    [
      'bin/paver.js',
      'detect',
      '--input',
      file,
      '--lookback',
      PARAMS.DETECTOR_LOOKBACK,
      '--max-candidates',
      PARAMS.DETECTOR_MAX_CANDIDATES,
      '--task-idle-ms',
      IDLE_MS,
    ],
    { PATH: process.env.PATH ?? '' },
  );
  expect(await p.exited).toBe(0);
  const out = p.output();
  return JSON.parse(out.slice(out.indexOf('['), out.lastIndexOf(']') + 1)) as OfflineCandidate[];
}

/** A detector process, ready; `procs` collects it for the file's clean-up. */
export async function startDetector(env: Record<string, string>, procs: Proc[]): Promise<Proc> {
  const p = await startProcess(['bin/paver.js', 'run', 'detector'], env);
  procs.push(p);
  await waitFor(() => isReady(p), 'detector /readyz').catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output()}`);
  });
  return p;
}

export const metrics = async (p: Proc) => parsePrometheus(String((await getJson(p.url('/metrics'))).body));
export const candidates = async (p: Proc) =>
  (await getJson(p.url('/candidates?tenant_id=default&agent_id=agent-0'))).body;

/**
 * The detector's topics for `env`: tool calls over `partitions`, flow candidates (compacted), dead letters; and,
 * with `checkpoints`, a checkpoint topic of the test's own (named after its tool-calls topic).
 */
export async function detectorTopics(
  env: Record<string, string>,
  partitions: number,
  { checkpoints = true } = {},
): Promise<void> {
  if (checkpoints) env.DETECTOR_TOPIC_CHECKPOINTS = `${env.PAVER_TOPIC_TOOL_CALLS!}.detector-checkpoints`;
  await createTopics([
    { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions },
    { topic: env.PAVER_TOPIC_FLOW_CANDIDATES!, compacted: true },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS! },
  ]);
}

/** Events to the tool-calls topic, keyed by session as agents publish them. */
export const sendEvents = (env: Record<string, string>, events: readonly { session_id: string }[]) =>
  produce(
    env.PAVER_TOPIC_TOOL_CALLS!,
    events.map((e) => ({ key: e.session_id, value: JSON.stringify(e) })),
  );
