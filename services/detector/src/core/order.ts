/**
 * Code-point order, which equals the UTF-8 byte order Redis uses for equal-score ZSET members. The Lua
 * scripts compare bytes explicitly (their `bytesLess`): Lua's own `<` on strings follows the locale.
 */
export function codePointCompare(a: string, b: string): number {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.codePointAt(i)!;
    const y = b.codePointAt(i)!;
    if (x !== y) return x < y ? -1 : 1;
    if (x > 0xffff) i++;
  }
  return a.length < b.length ? -1 : a.length > b.length ? 1 : 0;
}
