import { describe, expect, it } from 'vitest';
import { liveCandidates } from '../../src/core/detect.js';
import { DEFAULT_PARAMS } from '../../src/core/params.js';
import { DEDUPE_PREFIX, dedupeKeyOf } from '../../../../shared/core/dedupe-key.js';
import { toolsOfDedupeKey } from '../../src/core/select.js';
import { DetectorState } from '../../src/core/state.js';

const scope = { tenant: 'default', agent: 'default' };

/** Reads a dedupe_key back into tool names: only possible when the key is unambiguous. */
function toolsOfKey(key: string): string[] {
  expect(key.startsWith(DEDUPE_PREFIX)).toBe(true);
  return toolsOfDedupeKey(key);
}

function run(s: DetectorState, task: string, tools: string[], ts: number) {
  tools.forEach((tool, step) =>
    s.apply({
      kind: 'call',
      scope,
      task,
      eventId: `${task}-${step}`,
      ts: ts + step,
      step,
      tool,
      cost: 10_000,
    }),
  );
  s.apply({ kind: 'done', scope, task, eventId: `${task}-done`, ts: ts + tools.length });
}

describe('dedupe_key', () => {
  it('keeps the reference format, byte for byte, for names without `→` or `%`', () => {
    expect(dedupeKeyOf(['file_read', 'validate_yaml', 'file_write', 'bash_execute'])).toBe(
      'flow_offload:file_read→validate_yaml→file_write→bash_execute',
    );
    expect(dedupeKeyOf(['a b', 'c/d', 'x:y', 'ü', 'x'])).toBe('flow_offload:a b→c/d→x:y→ü→x');
  });

  it('gives two different sequences two keys when names hold the separator or the escape', () => {
    expect(dedupeKeyOf(['a→b', 'c'])).not.toBe(dedupeKeyOf(['a', 'b→c']));
    expect(dedupeKeyOf(['a→b', 'c'])).toBe('flow_offload:a%E2%86%92b→c');
    expect(dedupeKeyOf(['a%E2%86%92b', 'c'])).not.toBe(dedupeKeyOf(['a→b', 'c']));
    expect(dedupeKeyOf(['a%25'])).not.toBe(dedupeKeyOf(['a%']));
  });

  it('reads back into the same tool names (so no two sequences share a key), over random names', () => {
    const alphabet = ['a', '→', '%', '2', '5', 'E', '8', '9', '6'];
    let seed = 7;
    const rnd = (n: number) => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed % n;
    };
    for (let i = 0; i < 5_000; i++) {
      const tools = Array.from({ length: 1 + rnd(4) }, () =>
        Array.from({ length: 1 + rnd(6) }, () => alphabet[rnd(alphabet.length)]!).join(''),
      );
      expect(toolsOfKey(dedupeKeyOf(tools))).toEqual(tools);
    }
  });

  it('the detector proposes ["a→b","c","d"] and ["a","b→c","d"] as two candidates under two keys', () => {
    const s = new DetectorState(DEFAULT_PARAMS);
    for (let i = 0; i < 3; i++) run(s, `x${i}`, ['a→b', 'c', 'd'], i * 100);
    for (let i = 0; i < 3; i++) run(s, `y${i}`, ['a', 'b→c', 'd'], 1_000 + i * 100);
    const live = liveCandidates(s.frequentStats(scope), DEFAULT_PARAMS);
    expect(live.map((c) => c.tool_sequence).sort()).toEqual([
      ['a', 'b→c', 'd'],
      ['a→b', 'c', 'd'],
    ]);
    expect(new Set(live.map((c) => c.dedupe_key)).size).toBe(2);
    for (const c of live) expect(toolsOfKey(c.dedupe_key)).toEqual(c.tool_sequence);
  });
});
