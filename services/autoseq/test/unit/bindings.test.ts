import { describe, expect, it } from 'vitest';
import {
  buildArgs,
  canonicalJson,
  enumerateArgs,
  enumerateSources,
  forgetIndexes,
  pathKey,
  resolveSource,
  sourceKey,
  userShapes,
  type BindingContext,
  type Source,
} from '../../../../shared/core/bindings.js';

const kinds = (ss: Source[]) => ss.map((s) => s.kind);

describe('bindings: enumerate and resolve each source kind', () => {
  const ctx: BindingContext = {
    userText: 'Hi, my user id is emma_kim_9957 and the code is EHGLP3.',
    calls: [
      { tool: 'find_user', args: { q: 'emma' }, observation: 'emma_kim_9957' },
      {
        tool: 'get_order',
        args: { order_id: 'EHGLP3' },
        observation: {
          items: [
            { sku: 'A1', qty: 2 },
            { sku: 'B2', qty: 1 },
          ],
          user: { id: 'emma_kim_9957' },
        },
      },
    ],
  };

  it('output path of the previous call, and of the last call of a tool', () => {
    const s = enumerateSources(ctx, 'get_user', 'emma_kim_9957');
    expect(s[0]).toEqual({ kind: 'prev', part: 'out', path: ['user', 'id'] });
    expect(s).toContainEqual({ kind: 'last', tool: 'find_user', part: 'out', path: [] });
    for (const src of s)
      expect(resolveSource(ctx, 'get_user', src)).toEqual({ ok: true, value: 'emma_kim_9957' });
  });

  it('argument path of an earlier call', () => {
    expect(enumerateSources(ctx, 'cancel', 'EHGLP3')).toContainEqual({
      kind: 'prev',
      part: 'args',
      path: ['order_id'],
    });
  });

  it('list element by index', () => {
    const s = enumerateSources(ctx, 'x', 'B2');
    expect(s).toContainEqual({ kind: 'prev', part: 'out', path: ['items', 1, 'sku'] });
    expect(kinds(s)).not.toContain('loop'); // no call of x yet: element 0 would be next, not 1
  });

  it('loop: the next element not yet used by the next tool, in list order', () => {
    const s0 = enumerateSources(ctx, 'get_item', 'A1');
    const loop = { kind: 'loop', tool: 'get_order', part: 'out', list: ['items'], item: ['sku'] } as const;
    expect(s0).toContainEqual(loop);
    const after = {
      ...ctx,
      calls: [...ctx.calls, { tool: 'get_item', args: { sku: 'A1' }, observation: {} }],
    };
    expect(resolveSource(after, 'get_item', loop)).toEqual({ ok: true, value: 'B2' });
    expect(enumerateSources(after, 'get_item', 'B2')).toContainEqual(loop);
    const done = { ...after, calls: [...after.calls, { tool: 'get_item', args: { sku: 'B2' } }] };
    expect(resolveSource(done, 'get_item', loop)).toEqual({ ok: false });
  });

  it('loop: an element the next tool already took out of order is skipped, not fetched again', () => {
    const loop = { kind: 'loop', tool: 'list', part: 'out', list: ['ids'], item: [] } as const;
    const list = { tool: 'list', args: {}, observation: { ids: ['A', 'B', 'C'] } };
    // The agent looked at B first (the user named it), then walks the list: A, then C — never B again.
    const afterB = { calls: [list, { tool: 'get', args: { id: 'B' }, observation: {} }] };
    expect(resolveSource(afterB, 'get', loop)).toEqual({ ok: true, value: 'A' });
    expect(enumerateSources(afterB, 'get', 'A')).toContainEqual(loop);
    const afterA = { calls: [...afterB.calls, { tool: 'get', args: { id: 'A' }, observation: {} }] };
    expect(resolveSource(afterA, 'get', loop)).toEqual({ ok: true, value: 'C' });
    expect(enumerateSources(afterA, 'get', 'C')).toContainEqual(loop);
    expect(enumerateSources(afterA, 'get', 'B')).not.toContainEqual(loop);
  });

  it('constant', () => {
    expect(enumerateSources(ctx, 'x', true)).toEqual([{ kind: 'const', value: true }]);
    expect(resolveSource({ calls: [] }, 'x', { kind: 'const', value: { a: 1 } })).toEqual({
      ok: true,
      value: { a: 1 },
    });
  });

  it('user text: a shape and an index, never the value itself', () => {
    const s = enumerateSources({ calls: [], userText: ctx.userText }, 'x', 'EHGLP3');
    const user = s.filter((x) => x.kind === 'user');
    expect(user.length).toBeGreaterThan(0);
    for (const u of user) expect(JSON.stringify(u)).not.toContain('EHGLP3');
    // Another task, another code: the same binding extracts it.
    const other = { calls: [], userText: 'Please cancel reservation 4WQ150 for me' };
    const set = user.find((u) => u.kind === 'user' && u.pattern.includes('{6}'))!;
    expect(resolveSource(other, 'x', set)).toEqual({ ok: true, value: '4WQ150' });
    expect(userShapes('emma_kim_9957')[0]).toBe('[a-z]+_[a-z]+_[0-9]+');
    const run = { kind: 'user', pattern: userShapes('emma_kim_9957')[0]!, index: 0 } as const;
    expect(resolveSource({ calls: [], userText: 'I am mia_li_3668.' }, 'x', run)).toEqual({
      ok: true,
      value: 'mia_li_3668',
    });
  });

  it('user text: a token marked by a non-joining character, whatever its runs', () => {
    const at = (v: string) => userShapes(v).find((p) => p.startsWith('[A-Za-z0-9_.%+-]*@'))!;
    // Addresses of different run shapes share the "token holding @" shape (and it stops before a full stop).
    expect(at('mia.garcia2723@example.com')).toBe(at('omar12@mail.net'));
    const src = { kind: 'user', pattern: at('omar12@mail.net'), index: 0 } as const;
    expect(
      resolveSource({ calls: [], userText: 'Mail me at yusuf_rossi@corp.example.org.' }, 'x', src),
    ).toEqual({
      ok: true,
      value: 'yusuf_rossi@corp.example.org',
    });
  });

  it('pick: the field of the list element that mentions a word of the request', () => {
    const order = (names: string[]) => ({
      tool: 'get_order',
      args: { order_id: '#W1' },
      observation: { items: names.map((name, i) => ({ name, product_id: `P${i}${name.length}` })) },
    });
    const c1: BindingContext = {
      userText: 'My kettle broke, can I swap it?',
      calls: [order(['lamp', 'kettle', 'tent'])],
    };
    const pick = {
      kind: 'pick',
      tool: 'get_order',
      part: 'out',
      list: ['items'],
      item: ['product_id'],
    } as const;
    expect(enumerateSources(c1, 'get_product', 'P16')).toContainEqual(pick);
    expect(sourceKey(pick)).toBe(canonicalJson(pick));
    // Another task: the element named moved, the binding follows it; nothing named, no value.
    const c2: BindingContext = { userText: 'I want to return the tent.', calls: [order(['tent', 'mug'])] };
    expect(resolveSource(c2, 'get_product', pick)).toEqual({ ok: true, value: 'P04' });
    const c3: BindingContext = { userText: 'Where is my parcel?', calls: [order(['tent', 'mug'])] };
    expect(resolveSource(c3, 'get_product', pick)).toEqual({ ok: false });
  });

  it('user text: a capitalised word counted among those that do not start a sentence', () => {
    const name = userShapes('Mia').find((p) => p.startsWith('(?<!'))!;
    const src = { kind: 'user', pattern: name, index: 0 } as const;
    for (const [text, value] of [
      ["Hi, I'm Mia and I need help.", 'Mia'],
      ['Hello! My name is Omar. I have a problem.', 'Omar'],
      ['Good morning.\nThis is Ava Lopez', 'Ava'],
    ])
      expect(resolveSource({ calls: [], userText: text }, 'x', src)).toEqual({ ok: true, value });
  });
});

describe('bindings: build arguments', () => {
  const ctx: BindingContext = {
    calls: [{ tool: 'a', observation: { id: 7, items: [{ x: 1 }] } }],
  };
  it('builds every argument or fails on the first missing one', () => {
    expect(
      buildArgs(ctx, 'b', [
        { path: ['id'], source: { kind: 'prev', part: 'out', path: ['id'] } },
        { path: ['mode'], source: { kind: 'const', value: 'fast' } },
      ]),
    ).toEqual({ ok: true, args: { id: 7, mode: 'fast' } });
    expect(
      buildArgs(ctx, 'b', [{ path: ['id'], source: { kind: 'prev', part: 'out', path: ['nope'] } }]),
    ).toEqual({ ok: false, missing: ['id'] });
  });

  it('rebuilds an argument assembled from leaves; enumerate → build round-trips', () => {
    const args = { order: { id: 7, mode: 'fast', lines: [1] } };
    const units = enumerateArgs(ctx, 'b', args);
    expect(units.map((u) => u.path)).toEqual([
      ['order', 'id'],
      ['order', 'lines', 0],
      ['order', 'mode'],
    ]);
    const built = buildArgs(
      ctx,
      'b',
      units.map((u) => ({ path: u.path, source: u.sources[0]! })),
    );
    expect(built.ok && canonicalJson(built.args)).toBe(canonicalJson(args));
  });

  it('an integer beyond 2^53 (read rounded from JSON text) is never bound nor proposed', () => {
    // Two different 64-bit ids read as the same double: a proposal would carry the wrong one.
    const big = JSON.parse('{"id": 1234567890123456789}') as { id: number };
    expect(big.id).toBe(JSON.parse('1234567890123456800'));
    const c: BindingContext = {
      calls: [{ tool: 'a', observation: { id: big.id, small: 9007199254740991, items: [{ id: big.id }] } }],
    };
    expect(enumerateSources(c, 'b', big.id)).toEqual([]);
    expect(enumerateSources(c, 'b', 9007199254740991)).toContainEqual({
      kind: 'prev',
      part: 'out',
      path: ['small'],
    });
    // Inside an argument, only the inexact leaf goes unbound (so no rule can be built for the call).
    const units = enumerateArgs(c, 'b', { q: { id: big.id, n: 9007199254740991, f: 0.5 } });
    expect(units.map((u) => [u.path, u.sources.length > 0])).toEqual([
      [['q', 'f'], true],
      [['q', 'id'], false],
      [['q', 'n'], true],
    ]);
    // A binding learned on exact values does not copy an inexact one when it comes.
    expect(
      buildArgs(c, 'b', [{ path: ['id'], source: { kind: 'prev', part: 'out', path: ['id'] } }]),
    ).toEqual({
      ok: false,
      missing: ['id'],
    });
    expect(
      buildArgs(c, 'b', [
        { path: ['x'], source: { kind: 'loop', tool: 'a', part: 'out', list: ['items'], item: [] } },
      ]),
    ).toEqual({ ok: false, missing: ['x'] });
    expect(
      buildArgs(c, 'b', [{ path: ['n'], source: { kind: 'prev', part: 'out', path: ['small'] } }]),
    ).toEqual({ ok: true, args: { n: 9007199254740991 } });
  });

  it('source and path keys are the canonical JSON of the source, for every kind (and units carry them)', () => {
    const sources: Source[] = [
      { kind: 'prev', part: 'out', path: ['a', 0, 'b"c'] },
      { kind: 'last', tool: 'get "x"', part: 'args', path: [] },
      { kind: 'loop', tool: 't', part: 'out', list: ['items'], item: ['sku'] },
      { kind: 'const', value: { z: [1, { y: null, x: 'é' }], a: true } },
      { kind: 'const', value: 'k' },
      { kind: 'user', pattern: '[A-Z0-9]{6}', index: 2 },
    ];
    for (const s of sources) expect(sourceKey(s)).toBe(canonicalJson(s));
    expect(pathKey(['a', 1, 'é\n'])).toBe(canonicalJson(['a', 1, 'é\n']));
    const units = enumerateArgs(ctx, 'x', { user_id: 'emma_kim_9957', sku: { s: 'A1', q: 2 }, f: false });
    for (const u of units) expect(u.keys).toEqual(u.sources.map((s) => canonicalJson(s)));
  });

  it('canonical JSON ignores key order', () => {
    expect(canonicalJson({ b: 1, a: [{ d: 1, c: 2 }] })).toBe(canonicalJson({ a: [{ c: 2, d: 1 }], b: 1 }));
  });

  it('argument names that are Object.prototype members stay keys, and pollute nothing', () => {
    const c: BindingContext = { calls: [{ tool: 'a', observation: { id: 'X7' } }] };
    const id = { kind: 'prev', part: 'out', path: ['id'] } as const;
    // Before: the path q.__proto__.polluted wrote Object.prototype.polluted, and the argument came out empty.
    const built = buildArgs(c, 'b', [{ path: ['q', '__proto__', 'polluted'], source: id }]);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(built.ok && JSON.parse(JSON.stringify(built.args))).toEqual(
      JSON.parse('{"q":{"__proto__":{"polluted":"X7"}}}'),
    );
    // Before: an object argument named `constructor` read Object's constructor and was never built.
    expect(buildArgs(c, 'b', [{ path: ['constructor', 'x'], source: id }])).toEqual({
      ok: true,
      args: { constructor: { x: 'X7' } },
    });
    const top = buildArgs(c, 'b', [{ path: ['__proto__'], source: id }]);
    expect(top.ok && Object.keys(top.args)).toEqual(['__proto__']);
  });
});

describe('bindings: user-text shapes on adversarial text', () => {
  const at = (v: string) => userShapes(v).find((p) => p.startsWith('[A-Za-z0-9_.%+-]*@'))!;

  it('a token shape runs in time linear in the text: a 64 KiB message of "a." does not stall learning', () => {
    // A user message is up to 64 KiB (LIMITS.textLength). Before, each start after a '.' scanned the rest of
    // the text and backtracked: 1.3 s of a blocked event loop per value and message (quadratic).
    const text = 'write to mia@x.io ' + 'a.'.repeat(32 * 1024 - 16);
    const t0 = performance.now();
    const learned = enumerateSources({ calls: [], userText: text }, 'send', 'mia@x.io');
    const src = { kind: 'user', pattern: at('mia@x.io'), index: 0 } as const;
    expect(resolveSource({ calls: [], userText: 'a.'.repeat(32 * 1024) }, 'x', src)).toEqual({ ok: false });
    expect(performance.now() - t0).toBeLessThan(250);
    expect(learned).toContainEqual(src);
  });

  it('finds the same tokens as the plain regular expression, on random text', () => {
    let seed = 7;
    const r = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const alphabet = ['a', 'Z', '1', '_', '.', '-', '%', '+', '@', '#', ' ', '\n', 'é'];
    const patterns = [at('omar12@mail.net'), userShapes('a#b').find((p) => p.includes('#'))!];
    for (let n = 0; n < 3000; n++) {
      const text = Array.from(
        { length: Math.floor(r() * 30) },
        () => alphabet[Math.floor(r() * alphabet.length)],
      ).join('');
      for (const pattern of patterns) {
        const re = new RegExp(`(?<![A-Za-z0-9_])${pattern}(?![A-Za-z0-9_])`, 'g');
        const want = [...text.matchAll(re)].map((m) => m[0]);
        for (let index = 0; index <= want.length; index++)
          expect(
            resolveSource({ calls: [], userText: text }, 'x', { kind: 'user', pattern, index }),
            text,
          ).toEqual(index < want.length ? { ok: true, value: want[index] } : { ok: false });
      }
    }
  });
});

describe('bindings: forgetIndexes', () => {
  it('drops derived indexes only: the same sources after as before', () => {
    const ctx: BindingContext = {
      calls: [
        { tool: 'list', args: { owner: 'u1' }, observation: { rows: [{ id: 'R1' }, { id: 'R2', n: 7 }] } },
        { tool: 'get', args: { id: 'R1' }, observation: { id: 'R1', n: 7, tags: ['x', 'R2'] } },
      ],
    };
    const args = { id: 'R2', n: 7, owner: 'u1', both: { a: 'R1', b: 'x' } };
    const before = enumerateArgs(ctx, 'get', args);
    forgetIndexes(ctx.calls);
    expect(enumerateArgs(ctx, 'get', args)).toEqual(before);
    forgetIndexes([{ tool: 'none' }, { tool: 'text', observation: 'plain', args: {} }]);
  });
});
