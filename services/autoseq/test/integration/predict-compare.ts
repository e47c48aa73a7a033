import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';
import { catalogKey, type NextActionRecord } from '../../../../schemas/index.js';
import { createTopics, waitFor } from '../../../../test/helpers/kafka.js';
import { isReady, serviceEnv, startProcess, type Proc } from '../../../../test/helpers/process.js';
import type { PredictLine } from '../../src/core/learn/engine.js';
import { DEFAULT_LEARN, type LearnOptions } from '../../src/core/learn/learner.js';
import { replay } from '../../src/learn-cli.js';

/**
 * The environment of an autoseq that learns with `opts` (as `paver predict` is given them), on fresh
 * 1-partition topics it creates: one partition, so the service reads the file's order as predict does.
 */
export async function learnedServiceEnv(name: string, opts: LearnOptions): Promise<Record<string, string>> {
  const env = serviceEnv({
    AUTOSEQ_GROUP_ID: `${name}-${Date.now()}`,
    PAVER_TOPIC_TOOL_CATALOG: `cat-${name}-${Date.now()}`,
    AUTOSEQ_CATALOG_WAIT_MS: '0',
    AUTOSEQ_LEARN_MIN_TRIALS: String(opts.minTrials),
    AUTOSEQ_LEARN_MIN_PRECISION: String(opts.minPrecision),
    AUTOSEQ_LEARN_TARGET_PRECISION: String(opts.targetPrecision),
    AUTOSEQ_LEARN_MAX_CONTEXTS: String(opts.maxContexts),
    AUTOSEQ_LEARN_MAX_SLOTS: String(opts.maxSlots),
  });
  await createTopics([
    { topic: env.PAVER_TOPIC_TOOL_CALLS!, partitions: 1 },
    { topic: env.PAVER_TOPIC_NEXT_ACTIONS!, partitions: 1 },
    { topic: env.PAVER_TOPIC_DEAD_LETTERS!, partitions: 1 },
    { topic: env.PAVER_TOPIC_TOOL_CATALOG!, partitions: 1, compacted: true },
  ]);
  return env;
}

/**
 * Holds the service's next-action records to `paver predict`'s lines over the same events (in stream order;
 * predict's lines are per tool call): the record in force before call j+1 of a task, the one published after
 * call j or after a later user message since, is the proposal predict holds for call j+1. Returns how many
 * were compared.
 */
export function expectSameAsPredict(
  events: { type: string; event_id: string; task_id: string }[],
  byEvent: Map<string, NextActionRecord>,
  predicted: PredictLine[],
): number {
  const held = new Map<string, NextActionRecord>();
  let compared = 0;
  let i = 0;
  for (const e of events) {
    if (e.type === 'user_message') {
      const rec = byEvent.get(e.event_id);
      if (rec) held.set(e.task_id, rec);
      continue;
    }
    if (e.type !== 'tool_call') continue;
    const rec = held.get(e.task_id);
    if (rec) {
      const fromService =
        rec.origin === 'learned' && rec.event_type === 'auto_seq_detected_unique'
          ? {
              tool: rec.tool,
              args: rec.args,
              origin: 'learned',
              state: rec.rule_state,
              rule_id: rec.rule_id,
              confidence: rec.confidence,
            }
          : null;
      expect({ event: e.event_id, proposal: fromService }).toEqual({
        event: e.event_id,
        proposal: predicted[i]!.proposal,
      });
      compared++;
    }
    held.set(e.task_id, byEvent.get(e.event_id)!);
    i++;
  }
  return compared;
}

/** Starts `paver run autoseq` with `env`, adds it to `procs` (killed after the file), and waits until it is ready. */
export async function startAutoseq(env: Record<string, string>, procs: Proc[]): Promise<Proc> {
  const p = await startProcess(['bin/paver.js', 'run', 'autoseq'], env);
  procs.push(p);
  await waitFor(() => isReady(p), 'autoseq /readyz').catch((err: Error) => {
    throw new Error(`${err.message}\n${p.output()}`);
  });
  return p;
}

/** The default scope's catalog policy record: auto-seq on, executable. */
export const policyRecord = () => ({
  key: catalogKey('default', 'default', 'policy'),
  value: JSON.stringify({
    schema_version: 1,
    kind: 'policy',
    policy: { auto_seq_enabled: true, auto_seq_execute: true },
  }),
});

/** A catalog record of a read-only tool of the default scope that auto-seq may run. */
export const toolRecord = (name: string, args_schema: unknown) => ({
  key: catalogKey('default', 'default', 'tool', name),
  value: JSON.stringify({
    schema_version: 1,
    kind: 'tool',
    tool: { name, args_schema, side_effects: 'read', auto_seq: true, auto_seq_execute: true },
  }),
});

/**
 * Bars low enough for rules to become active on a small dev file (what tests of active rules need), with bounds
 * small enough that eviction runs: the same values go to `paver predict` and, by environment, to the service.
 */
export const LOW_BAR: LearnOptions = {
  ...DEFAULT_LEARN,
  minTrials: 5,
  minPrecision: 0.5,
  targetPrecision: 0.5,
  maxContexts: 40,
  maxSlots: 20,
};

/** `paver predict`'s lines over an events file, through the offline command's own function. */
export async function predictFile(file: string, opts: LearnOptions): Promise<PredictLine[]> {
  const out: PredictLine[] = [];
  await replay(
    file,
    opts,
    null,
    (l) => out.push(l),
    () => undefined,
  );
  return out;
}

/** The same over events given as JSONL lines (a temporary file, removed after). */
export async function predictLines(lines: string[], opts: LearnOptions): Promise<PredictLine[]> {
  const dir = mkdtempSync(join(tmpdir(), 'paver-aseq-predict-'));
  const file = join(dir, 'events.jsonl');
  writeFileSync(file, lines.join('\n') + '\n');
  try {
    return await predictFile(file, opts);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
