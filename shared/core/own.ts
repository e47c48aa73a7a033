/**
 * Records keyed by what users name (tools, steps, ids) must not read or write inherited members: a tool named
 * `constructor` or `toString` would read a function from `Object.prototype`, and one named `__proto__` would
 * set the record's prototype instead of a key. Plain objects stay (they are stored as JSON); these two calls
 * are the only way such records are read and written by key.
 */

/** The record's own value at `key`, never an inherited member. */
export const own = <T>(o: Readonly<Record<string, T>>, key: string): T | undefined =>
  Object.hasOwn(o, key) ? o[key] : undefined;

/**
 * Sets `key` as the record's own property (`o[key] = v` with `__proto__` would replace the prototype). Only
 * `__proto__` is an accessor on `Object.prototype`; any other key assigned makes an own data property (the
 * inherited ones are writable), and plain assignment keeps the object in V8's fast mode, where
 * `defineProperty` on every key cost the learner several percent of its CPU.
 */
export function setOwn<T>(o: Record<string, T>, key: string, value: T): T {
  if (key === '__proto__')
    Object.defineProperty(o, key, { value, writable: true, enumerable: true, configurable: true });
  else o[key] = value;
  return value;
}
