import { describe, expect, it } from 'vitest';
import { rng } from '../../../../testkit/streams.js';
import { decode, isStoredV1, storedV1 } from '../../src/adapters/redis/store.js';
import { applyEvent, newSession } from '../../src/core/session.js';

describe('stored session state', () => {
  it('the hand-written check accepts exactly what the storedV1 schema accepts', () => {
    const r = rng(9);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const any: unknown[] = [
      null,
      'x',
      '',
      0,
      1,
      -1,
      2,
      1.5,
      2 ** 53,
      -0,
      true,
      [],
      ['a'],
      ['a', 1],
      [null],
      {},
      '1',
    ];
    const good: unknown[][] = [
      ['step', null],
      [0, 3, 2 ** 53 - 1],
      [0, 1],
      [[], ['a', 'b']],
      [[], ['s']],
      [[], ['e1']],
    ];
    good.push([null, 0, 7, 2 ** 53 - 1], [null, '12', '0']);
    let accepted = 0;
    for (let i = 0; i < 20_000; i++) {
      const v: unknown[] = good.map((choices) => (r() < 0.9 ? pick(choices) : pick(any)));
      if (r() < 0.05) v.push(pick(any));
      if (r() < 0.05) v.pop();
      const candidate = r() < 0.02 ? pick(any) : v;
      const expected = storedV1.safeParse(candidate).success;
      expect(isStoredV1(candidate), JSON.stringify(candidate)).toBe(expected);
      if (expected) accepted++;
    }
    expect(accepted).toBeGreaterThan(1000); // both sides of the check exercised
  });

  it('decodes a stored state, and reads another layout as a fresh session', () => {
    expect(decode(JSON.stringify(['s', 2, 1, ['a'], ['s'], ['e'], 0, '41']))).toEqual({
      step: 's',
      index: 2,
      held: true,
      history: ['a'],
      msg: ['s'],
      seen: ['e'],
      pos: { p: 0, o: '41' },
    });
    expect(decode(JSON.stringify({ step: 's' }))).toEqual(newSession());
  });

  it('reads a value that is not JSON, or whose stored offset is not a number, as a fresh session (no throw)', () => {
    // Another layout's binary encoding (MessagePack), as a downgrade or a shared prefix would leave.
    expect(decode('\u0082\u00a1s\u00a4flow')).toEqual(newSession());
    expect(decode('["s", 2, 0, [], [], []')).toEqual(newSession());
    const badOffset = decode(JSON.stringify(['s', 2, 0, ['a'], [], ['e'], 0, 'x41']));
    expect(badOffset).toEqual(newSession());
    // What the consumer does next with it: the redelivery guard compares offsets as BigInt.
    const e = {
      type: 'tool_call',
      event_id: 'e1',
      ts: 1,
      tenant_id: 't',
      agent_id: 'a',
      session_id: 's',
      task_id: 'k',
      step: 1,
      tool: 'a',
    } as const;
    expect(applyEvent(undefined, badOffset, e, { partition: 0, offset: '7' }).duplicate).toBe(false);
  });
});
