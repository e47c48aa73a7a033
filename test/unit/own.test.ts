import { describe, expect, it } from 'vitest';
import { own, setOwn } from '../../shared/core/own.js';

describe('records keyed by user-given names', () => {
  it('setOwn makes an own, enumerable key of any name, __proto__ and inherited members included', () => {
    const o: Record<string, number> = {};
    for (const [i, k] of ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf', 'x'].entries())
      expect(setOwn(o, k, i)).toBe(i);
    expect(Object.getPrototypeOf(o)).toBe(Object.prototype);
    expect(Object.keys(o)).toEqual([
      '__proto__',
      'constructor',
      'toString',
      'hasOwnProperty',
      'valueOf',
      'x',
    ]);
    expect(own(o, '__proto__')).toBe(0);
    expect(own(o, 'toString')).toBe(2);
    // What is stored is what is read back.
    const back = JSON.parse(JSON.stringify(o)) as Record<string, number>;
    expect(own(back, '__proto__')).toBe(0);
    expect(Object.keys(back)).toEqual(Object.keys(o));
    setOwn(o, '__proto__', 9);
    setOwn(o, 'x', 7);
    expect([own(o, '__proto__'), own(o, 'x')]).toEqual([9, 7]);
  });
  it('own never reads an inherited member', () => {
    expect(own({}, 'constructor')).toBeUndefined();
    expect(own({}, '__proto__')).toBeUndefined();
  });
});
