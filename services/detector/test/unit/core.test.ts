import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  candidateKey,
  diffCandidates,
  retractedRecord,
  titleCase,
  toRecord,
} from '../../src/core/candidate.js';
import { liveCandidates } from '../../src/core/detect.js';
import { recordGrams } from '../../src/core/grams.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';
import { DetectorState, IGNORE_REASONS } from '../../src/core/state.js';
import { requestTermsOf } from '../../src/core/terms.js';
import { trimToken } from '../../../../shared/core/terms.js';
import { pipelineError } from '../../src/adapters/redis/store.js';
import { flowCandidateRecordV1 } from '../../../../schemas/index.js';
import { aheadOfRecord, type DetectorOp } from '../../src/core/ops.js';

const scope = { tenant: 'default', agent: 'default' };
const call = (task: string, step: number, tool: string, ts: number, cost = 10_000): DetectorOp => ({
  kind: 'call',
  scope,
  task,
  eventId: `${task}-${step}`,
  ts,
  step,
  tool,
  cost,
});
const done = (task: string, ts: number): DetectorOp => ({
  kind: 'done',
  scope,
  task,
  eventId: `${task}-done`,
  ts,
});

function runTask(s: DetectorState, task: string, tools: string[], ts: number, complete = true) {
  tools.forEach((t, i) => s.apply(call(task, i, t, ts + i)));
  if (complete) s.apply(done(task, ts + tools.length));
}

describe('detector core', () => {
  it('proposes the reference example: 5 runs of a 4-step flow at 9 cents, savings 42.75', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    const seq = ['file_read', 'validate_yaml', 'file_write', 'bash_execute'];
    for (let i = 0; i < 5; i++) {
      seq.forEach((t, j) => s.apply(call(`t${i}`, j, t, i * 100 + j, [20_000, 30_000, 30_000, 10_000][j])));
      s.apply(done(`t${i}`, i * 100 + 50));
    }
    const [c] = liveCandidates(s.frequentStats(scope), DEFAULT_PARAMS);
    expect(c).toMatchObject({
      tool_sequence: seq,
      occurrence_count: 5,
      match_type: 'exact',
      estimated_token_savings: 42.75,
      avg_cost_per_execution: 9,
      dedupe_key: 'flow_offload:file_read→validate_yaml→file_write→bash_execute',
    });
    expect(c!.proposed_flow.name).toBe('Auto: file_read → validate_yaml → file_write → bash_execute');
    expect(c!.proposed_flow.steps[0]).toEqual({
      id: 'step_1',
      name: 'File Read',
      skill_key: 'file_read',
      depends_on: [],
      output_key: 'step_1',
      retry_max: 2,
      retry_backoff: 1,
      timeout_seconds: 120,
      on_failure: 'stop',
      input_map: { input: '{{_trigger.input}}' },
    });
    expect(c!.proposed_flow.steps[1]!.input_map).toEqual({ input: '{{step_1.output}}' });
    const rec = toRecord(c!, scope, 1);
    expect(flowCandidateRecordV1.parse(rec).promotion_effect?.agent_prompt_hint).toContain(
      "flow_run('Auto: file_read",
    );
  });

  it('keeps the common 3-step flow found inside longer tasks (the case the reference drops)', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    runTask(s, 'a', ['x', 'y', 'z'], 0);
    runTask(s, 'b', ['p', 'x', 'y', 'z', 'q'], 10);
    runTask(s, 'c', ['x', 'y', 'z', 'r'], 20);
    const [c] = liveCandidates(s.frequentStats(scope), DEFAULT_PARAMS);
    expect(c).toMatchObject({
      tool_sequence: ['x', 'y', 'z'],
      occurrence_count: 3,
      match_type: 'subsequence',
    });
  });

  it('counts a record once however often it contains a sequence, at its first position cost', () => {
    const { grams } = recordGrams(['a', 'b', 'c', 'a', 'b', 'c'], [1, 2, 3, 10, 20, 30], {
      ...DEFAULT_PARAMS,
      maxLength: 3,
    });
    expect(grams.find((g) => g.key === ['a', 'b', 'c'].join('\u001f'))!.cost).toBe(6);
    expect(grams.filter((g) => g.key === ['a', 'b', 'c'].join('\u001f'))).toHaveLength(1);
  });

  it('completes idle tasks on the event-time clock and ignores their late events', () => {
    const p = { ...DEFAULT_PARAMS, taskIdleMs: 100 };
    const s = new DetectorState(p);
    for (const t of ['a', 'b', 'c']) runTask(s, t, ['x', 'y', 'z'], 0, false);
    expect(liveCandidates(s.frequentStats(scope), p)).toEqual([]);
    s.apply(call('other', 0, 'w', 500)); // the clock moves past the idle limit
    expect(s.windowTasks(scope)).toEqual(['a', 'b', 'c']);
    expect(liveCandidates(s.frequentStats(scope), p)[0]?.occurrence_count).toBe(3);
    const r = s.apply(call('a', 9, 'late', 501));
    expect(r.ignored).toBe(1);
  });

  it('an event of a task open on another partition is misrouted; the task stays its first partition’s', () => {
    const p = { ...DEFAULT_PARAMS, taskIdleMs: 100 };
    const s = new DetectorState(p);
    const on = (op: DetectorOp, partition: number) => s.apply({ ...op, partition });
    on(call('t', 0, 'x', 0), 0);
    expect(on(call('t', 1, 'y', 1), 1).ignoredBy).toMatchObject({ misrouted: 1 });
    expect(on(done('t', 2), 1).ignoredBy).toMatchObject({ misrouted: 1 });
    expect(s.windowTasks(scope)).toEqual([]);
    // Partition 0's clock closes it, with what came on partition 0.
    on(call('u', 0, 'w', 200), 0);
    expect(s.windowTasks(scope)).toEqual(['t']);
    expect(s.windowRecords(scope)[0]!.tools).toEqual(['x']);
    // Its id is known on partition 0 only: there, a late event; on partition 1, a new task whose record replaces it.
    expect(on(call('t', 5, 'v', 201), 0).ignoredBy).toMatchObject({ late: 1 });
    expect(on(call('t', 6, 'z', 202), 1).applied).toBe(1);
    on(done('t', 203), 1);
    expect(s.windowRecords(scope).map((r) => r.tools)).toEqual([['z']]);
  });

  it('slides: a record leaving the window takes its counts with it, and a dropped candidate is retracted', () => {
    const p = { ...DEFAULT_PARAMS, lookback: 3 };
    const s = new DetectorState(p);
    for (let i = 0; i < 3; i++) runTask(s, `a${i}`, ['x', 'y', 'z'], i * 10);
    const before = liveCandidates(s.frequentStats(scope), p);
    expect(before).toHaveLength(1);
    runTask(s, 'b0', ['k', 'l', 'm'], 100);
    const after = liveCandidates(s.frequentStats(scope), p);
    expect(after).toEqual([]);
    const published = new Map(before.map((c) => [c.dedupe_key, JSON.stringify(c)]));
    const d = diffCandidates(published, after);
    expect(d.retracts).toEqual(['flow_offload:x→y→z']);
    expect(flowCandidateRecordV1.parse(retractedRecord(d.retracts[0]!, scope, 1)).status).toBe('retracted');
    expect(diffCandidates(published, before).upserts).toEqual([]);
  });

  it('a retraction’s title names the tools as the active record’s did, not as escaped in the key', () => {
    const tools = ['a→b', '50%', 'c%E2%86%92d', 'e'];
    const live = liveCandidates([{ key: tools.join('\u001f'), support: 3, exact: 3, cost: 30_000 }], {
      ...DEFAULT_PARAMS,
      minLength: 1,
    });
    const c = live[0]!;
    expect(c.tool_sequence).toEqual(tools);
    // The key stays escaped: it must read one way.
    expect(c.dedupe_key).toBe('flow_offload:a%E2%86%92b→50%25→c%25E2%2586%2592d→e');
    const retracted = retractedRecord(c.dedupe_key, scope, 2);
    expect(retracted.title).toBe('Auto-Flow: a→b → 50% → c%E2%86%92d → e');
    expect(retracted.title).toBe(toRecord(c, scope, 1).title);
    expect(flowCandidateRecordV1.parse(retracted).dedupe_key).toBe(c.dedupe_key);
  });

  it('names steps in Title Case and keys records by scope', () => {
    expect(titleCase('validate_yaml')).toBe('Validate Yaml');
    expect(titleCase('http-get.v2')).toBe('Http Get V2');
    expect(candidateKey({ tenant: 't', agent: 'a' }, 'flow_offload:x')).toBe('t/a/flow_offload:x');
    // Ids may hold '/': two scopes shared a key, and compaction kept one tenant's record.
    const k = 'flow_offload:a→b/c';
    expect(candidateKey({ tenant: 'acme', agent: 'sales/bot' }, k)).not.toBe(
      candidateKey({ tenant: 'acme/sales', agent: 'bot' }, k),
    );
    expect(candidateKey({ tenant: 'acme', agent: 'sales/bot' }, k)).toBe(
      'acme/sales%2Fbot/flow_offload:a→b/c',
    );
    expect(candidateKey({ tenant: 'a%2Fb', agent: 'c' }, k)).not.toBe(
      candidateKey({ tenant: 'a/b', agent: 'c' }, k),
    );
    // Any other id keeps the key earlier versions gave it (their records stay the ones a new record replaces).
    expect(candidateKey({ tenant: 'acme corp', agent: 'sales@bot:1' }, k)).toBe(
      'acme corp/sales@bot:1/flow_offload:a→b/c',
    );
  });
});

describe('request terms (issue 14)', () => {
  it('keeps words only: no stop words, numbers, ids, emails, codes or very long tokens', () => {
    expect(
      requestTermsOf(
        "Hi! I'd like to EXCHANGE the keyboard I ordered (order #W2378156, user mia_li_3668, mia.li@example.com). " +
          'My reservationId is ZFA04Y, code HATHAT; supercalifragilisticexpialidocious-ish round-trip, the keyboard.',
      ),
    ).toEqual(['keyboard', 'ordered', 'order', 'user', 'code', 'round', 'trip']); // all capitals read as a code
    expect(requestTermsOf('')).toEqual([]);
    expect(requestTermsOf('Ünïcode Wörter bleiben')).toEqual(['ünïcode', 'wörter', 'bleiben']);
  });

  it("trims a token's ends as the regular expression it replaces does, in one pass", () => {
    let seed = 14;
    const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    // Letters (an astral one too), digits, punctuation, an emoji, lone surrogates.
    const alphabet = ['a', 'É', '7', '٣', '𠀀', '!', '-', '(', '😀', '\ud800', '\udc00', '.', '_'];
    for (let n = 0; n < 5_000; n++) {
      const raw = Array.from({ length: Math.floor(rnd() * 12) }, () => alphabet[Math.floor(rnd() * 13)]).join(
        '',
      );
      expect(trimToken(raw), JSON.stringify(raw)).toBe(raw.replace(/^[^\p{L}\p{N}]+|[^\p{L}\p{N}]+$/gu, ''));
    }
  });

  it('puts df over the tasks that contained the sequence into the candidate and its description', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    const msg = (task: string, text: string, ts: number): DetectorOp => ({
      kind: 'msg',
      scope,
      task,
      eventId: `${task}-m`,
      ts,
      terms: requestTermsOf(text),
    });
    s.apply(msg('a', 'I want to exchange my keyboard', 0));
    runTask(s, 'a', ['x', 'y', 'z'], 1);
    s.apply(msg('b', 'exchange a mouse please', 10));
    runTask(s, 'b', ['x', 'y', 'z'], 11);
    runTask(s, 'c', ['x', 'y', 'z'], 21); // no user message: not in `tasks`
    s.apply(msg('d', 'cancel my flight', 30)); // no x→y→z: not counted
    runTask(s, 'd', ['p', 'q', 'r'], 31);
    const [c] = liveCandidates(s.frequentStats(scope), DEFAULT_PARAMS, s.windowRecords(scope));
    expect(c!.request_terms).toEqual({
      tasks: 2,
      terms: [
        { term: 'exchange', df: 2 },
        { term: 'keyboard', df: 1 },
        { term: 'mouse', df: 1 },
      ],
    });
    expect(c!.proposed_flow.description).toContain('Requests: exchange, keyboard, mouse.');
    expect(flowCandidateRecordV1.parse(toRecord(c!, scope, 1)).candidate?.request_terms?.tasks).toBe(2);
    const off = liveCandidates(s.frequentStats(scope), { ...DEFAULT_PARAMS, requestTerms: false }, []);
    expect(off[0]!.request_terms).toBeUndefined();
    expect(off[0]!.proposed_flow.description).not.toContain('Requests');
  });

  it('the first message by (ts, event_id) wins whatever order redeliveries bring', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    const m = (eventId: string, ts: number, terms: string[]): DetectorOp => ({
      kind: 'msg',
      scope,
      task: 't',
      eventId,
      ts,
      terms,
    });
    s.apply(m('e2', 5, ['later']));
    s.apply(m('e1', 5, ['first']));
    s.apply(m('e0', 6, ['late']));
    runTask(s, 't', ['x'], 7);
    expect(s.windowRecords(scope)).toEqual([{ tools: ['x'], terms: ['first'] }]);
  });
});

describe('Redis reply classification (issue 11)', () => {
  it('a lost connection is retriable; a script error is a script failure, not retried', () => {
    const conn = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' });
    expect(pipelineError('apply', conn)).toMatchObject({ code: 'REDIS_UNAVAILABLE', retriable: true });
    const bug = new Error("ERR user_script:68: attempt to perform arithmetic on field '?' (a nil value)");
    expect(pipelineError('apply', bug)).toMatchObject({ code: 'REDIS_SCRIPT_FAILED', retriable: false });
  });
});

describe('events ahead of their Kafka record', () => {
  const produced = '1700000000000';
  it('an event further than the limit after its record was produced is ahead; at the limit it is not', () => {
    expect(aheadOfRecord(1_700_000_300_001, produced, 300_000)).toBe(true);
    expect(aheadOfRecord(1_700_000_300_000, produced, 300_000)).toBe(false);
    // A ts in microseconds is far ahead of any record.
    expect(aheadOfRecord(1_700_000_000_000_000, produced, 300_000)).toBe(true);
    // Old events (a backlog, a replay of history) are never ahead.
    expect(aheadOfRecord(1_600_000_000_000, produced, 300_000)).toBe(false);
  });
  it('no judgement when the check is off or the record has no timestamp', () => {
    expect(aheadOfRecord(1_800_000_000_000, produced, 0)).toBe(false);
    expect(aheadOfRecord(1_800_000_000_000, '-1', 300_000)).toBe(false);
    expect(aheadOfRecord(1_800_000_000_000, '', 300_000)).toBe(false);
  });
});

describe('paver_detector_events_ignored_total', () => {
  it('the READMEs list every reason an event is ignored for', () => {
    // The state's reasons, and `future` (main.ts: aheadOfRecord, before the state sees the event).
    const reasons = [...IGNORE_REASONS, 'future'].sort();
    for (const path of ['../../../../README.md', '../../README.md']) {
      const text = readFileSync(new URL(path, import.meta.url), 'utf8');
      const listed = [...text.matchAll(/paver_detector_events_ignored_total\{reason=([a-z_|]+)\}/g)];
      expect(listed.length, path).toBeGreaterThan(0);
      for (const m of listed) expect(m[1]!.split('|').sort(), path).toEqual(reasons);
    }
  });
});
