/**
 * Records keyed by what users name (tools, steps, ids) must not read or write inherited members: a tool named
 * `constructor` or `toString` would read a function from `Object.prototype`, and one named `__proto__` would
 * set the record's prototype instead of a key. Plain objects stay (they are stored as JSON); these two calls
 * are the only way such records are read and written by key.
 */

/** The record's own value at `key`, never an inherited member. */
export const own = <T>(o: Readonly<Record<string, T>>, key: string): T | undefined =>
  Object.hasOwn(o, key) ? o[key] : undefined;

/** Sets `key` as the record's own property (`o[key] = v` with `__proto__` would replace the prototype). */
export function setOwn<T>(o: Record<string, T>, key: string, value: T): T {
  Object.defineProperty(o, key, { value, writable: true, enumerable: true, configurable: true });
  return value;
}
