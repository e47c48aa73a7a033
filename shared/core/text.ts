/**
 * `s` cut to at most `max` UTF-16 code units, never between the halves of a surrogate pair: a lone half is not
 * valid Unicode, and JSON written from it carries a replacement character or is refused by the contract.
 */
export function cutText(s: string, max: number): string {
  if (s.length <= max) return s;
  const end = max > 0 && /[\uD800-\uDBFF]/.test(s[max - 1]!) ? max - 1 : max;
  return s.slice(0, end);
}
