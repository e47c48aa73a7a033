import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { escapeKeyPart, globLiteral, unescapeKeyPart } from '../../shared/redis/keys.js';

// Every character the escape rewrites, and the ones around them that could be read as part of a code.
const special = [
  '%',
  '{',
  '}',
  ':',
  '|',
  ' ',
  '\t',
  '\n',
  '\u00a0',
  '\u1680',
  '\u2000',
  '\u2028',
  '\u3000',
  '\ufeff',
];
const idChar = fc.oneof(
  fc.constantFrom(...special, '0', '2', 'a', 'u', 'f'),
  fc.string({ maxLength: 1, unit: 'binary' }),
);
const id = fc.array(idChar, { maxLength: 12 }).map((cs) => cs.join(''));

describe('key parts', () => {
  it('distinct ids never share an escaped form (U+2000 and a space before "00" used to)', () => {
    expect(escapeKeyPart('a\u2000')).not.toBe(escapeKeyPart('a 00'));
    fc.assert(
      fc.property(id, id, (a, b) => {
        if (a !== b) expect(escapeKeyPart(a)).not.toBe(escapeKeyPart(b));
      }),
      { numRuns: 3000 },
    );
  });

  it('unescape gives the id back, and refuses what the escape never makes', () => {
    fc.assert(
      fc.property(id, (a) => {
        const e = escapeKeyPart(a);
        expect(e).not.toMatch(/[{}:|\s]/);
        expect(unescapeKeyPart(e)).toBe(a);
      }),
      { numRuns: 3000 },
    );
    for (const bad of ['a%', '%zz', 'a b', 'x|y', '%41', '%u0041', '%2', 'a{b'])
      expect(unescapeKeyPart(bad), bad).toBeNull();
  });

  it('a glob literal matches only itself', () => {
    expect(globLiteral('p*[x]?\\')).toBe('p\\*\\[x\\]\\?\\\\');
    expect(globLiteral('paver-test.1')).toBe('paver-test.1');
  });
});
