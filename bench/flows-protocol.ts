/**
 * The issue-14 selection protocol, exactly, over a JSONL stream of runs (`node dist/bench/flows-protocol.js FILE...`).
 * For each run in stream order: the last 200 earlier runs → `paver detect --input H` → `paver flows
 * from-candidates` → `paver select --flows F --query <first user message>` → the chosen flow's steps scored
 * against the run's tool calls. The commands are the CLI's own entry points, called in-process with stdout
 * captured (same code, no process start-up per run). Also prints two references over the same candidates:
 * always the top candidate, and the best candidate in hindsight. Writes bench/results/flows-protocol.json.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { main } from '../cli/paver.js';
import { matchSteps, planOf, type Match } from '../services/flows/src/core/score.js';
import { requestTermsOf } from '../shared/core/terms.js';
import { say, writeResult } from './harness.js';

interface Run {
  lines: string[];
  query: string | null;
  calls: string[];
}

export function runsOf(text: string): Run[] {
  const runs = new Map<string, Run>();
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const e = JSON.parse(line) as { type: string; session_id: string; text?: string; tool?: string };
    let r = runs.get(e.session_id);
    if (!r) runs.set(e.session_id, (r = { lines: [], query: null, calls: [] }));
    r.lines.push(line);
    if (e.type === 'user_message' && r.query === null && e.text) r.query = e.text;
    if (e.type === 'tool_call' && e.tool) r.calls.push(e.tool);
  }
  return [...runs.values()];
}

async function capture(argv: string[]): Promise<string> {
  const out: string[] = [];
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = ((chunk: string | Uint8Array) => {
    out.push(typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8'));
    return true;
  }) as typeof process.stdout.write;
  let code: number;
  try {
    code = await main(argv);
  } finally {
    process.stdout.write = write;
  }
  if (code !== 0) throw new Error(`paver ${argv[0]} exited ${code}`);
  return out.join('');
}

/**
 * Until the detector attaches request_terms itself: the same statistics computed here from H (the tasks that
 * contain the candidate's tools in order), so that selection can be tuned meanwhile. Bench only.
 */
function simulateTerms(json: string, history: Run[]): string {
  const cands = JSON.parse(json) as { tool_sequence: string[]; request_terms?: unknown }[];
  const contains = (calls: string[], seq: string[]) => {
    let j = 0;
    for (const c of calls) if (c === seq[j] && ++j === seq.length) return true;
    return false;
  };
  for (const c of cands) {
    if (c.request_terms) continue;
    const df = new Map<string, number>();
    let tasks = 0;
    for (const r of history) {
      if (!r.query || !contains(r.calls, c.tool_sequence)) continue;
      tasks++;
      for (const t of requestTermsOf(r.query)) df.set(t, (df.get(t) ?? 0) + 1);
    }
    c.request_terms = {
      tasks,
      terms: [...df]
        .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
        .slice(0, 64)
        .map(([term, n]) => ({ term, df: n })),
    };
  }
  return JSON.stringify(cands);
}

interface FileFlow {
  id: string;
  steps: { skill_key?: string; for_each?: { body?: number } }[];
}

interface Tally {
  calls: number;
  proposed: number;
  matched: number;
  chosen: number;
}
const tally = (): Tally => ({ calls: 0, proposed: 0, matched: 0, chosen: 0 });
const add = (t: Tally, m: Match | null) => {
  if (!m) return;
  t.chosen++;
  t.proposed += m.proposed;
  t.matched += m.matched;
};
const report = (t: Tally) => ({
  coverage: Number((t.matched / Math.max(1, t.calls)).toFixed(4)),
  precision: Number((t.matched / Math.max(1, t.proposed)).toFixed(4)),
  chosen: t.chosen,
  matched: t.matched,
  proposed: t.proposed,
  calls: t.calls,
});

export async function protocol(file: string, history = 200) {
  const runs = runsOf(readFileSync(file, 'utf8'));
  const dir = mkdtempSync(join(tmpdir(), 'paver-protocol-'));
  const sel = tally();
  const top = tally();
  const best = tally();
  const extraArgs = (process.env.PROTOCOL_SELECT_ARGS ?? '').split(' ').filter(Boolean);
  try {
    for (let i = 0; i < runs.length; i++) {
      const run = runs[i]!;
      for (const t of [sel, top, best]) t.calls += run.calls.length;
      if (i % 25 === 0) say(`${basename(file)}: run ${i}/${runs.length}`);
      if (i === 0 || !run.query) continue;
      const h = join(dir, 'h.jsonl');
      writeFileSync(
        h,
        runs
          .slice(Math.max(0, i - history), i)
          .flatMap((r) => r.lines)
          .join('\n') + '\n',
      );
      const cands = join(dir, 'c.json');
      const detected = await capture(['detect', '--input', h]);
      writeFileSync(
        cands,
        process.env.PROTOCOL_SIM_TERMS
          ? simulateTerms(detected, runs.slice(Math.max(0, i - history), i))
          : detected,
      );
      const flowsFile = join(dir, 'f.json');
      writeFileSync(
        flowsFile,
        await capture([
          'flows',
          'from-candidates',
          '--input',
          cands,
          ...(process.env.PROTOCOL_HISTORY ? ['--history', h] : []),
        ]),
      );
      const written = JSON.parse(readFileSync(flowsFile, 'utf8')) as FileFlow[] | { flows: FileFlow[] };
      const flows = Array.isArray(written) ? written : written.flows;
      const stepsOf = (f: (typeof flows)[number]) => planOf(f.steps);
      if (flows.length) add(top, matchSteps(stepsOf(flows[0]!), run.calls));
      const ms = flows.map((f) => matchSteps(stepsOf(f), run.calls));
      const b = ms.reduce<Match | null>((acc, m) => (m.matched > (acc?.matched ?? 0) ? m : acc), null);
      add(best, b);
      const out = JSON.parse(
        await capture(['select', '--flows', flowsFile, '--query', run.query, ...extraArgs]),
      ) as { chosen: { id: string }[] };
      for (const c of out.chosen) {
        const f = flows.find((x) => x.id === c.id);
        if (f) {
          const m = matchSteps(stepsOf(f), run.calls);
          add(sel, m);
          if (process.env.PROTOCOL_DEBUG && m.proposed > m.matched)
            say(
              `miss: flow ${stepsOf(f)
                .map((p) => (p.body ? `${p.tool}*${p.body}` : p.tool))
                .join(',')} | run ${run.calls.slice(run.calls.indexOf(stepsOf(f)[0]!.tool)).join(',')}`,
            );
        }
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return {
    file: basename(file),
    runs: runs.length,
    select: report(sel),
    top_candidate: report(top),
    best_candidate: report(best),
  };
}

const files = process.argv.slice(2);
if (files.length) {
  const results = [];
  for (const f of files) {
    const r = await protocol(f);
    say(JSON.stringify(r));
    results.push(r);
  }
  if (!process.env.PROTOCOL_NO_WRITE)
    writeResult(process.env.PROTOCOL_HISTORY ? 'flows-protocol-history' : 'flows-protocol', {
      from_candidates: process.env.PROTOCOL_HISTORY ? '--input C --history H' : '--input C',
      protocol:
        'per run in stream order: last 200 earlier runs → paver detect → paver flows from-candidates → paver select --query <first user message>; chosen flow scored from the first call of its first tool, first mismatch ends it',
      results,
    });
}
