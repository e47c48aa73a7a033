/** A digest function the adapters supply (SHA-256 in Paver); core stays free of node:crypto. */
export type Hash = (text: string) => string;

export interface PayloadShape {
  payload_type: string;
  payload_keys_count: number;
  payload_fingerprint: string;
}

export function payloadType(x: unknown): string {
  if (x === undefined) return 'none';
  if (x === null) return 'null';
  if (Array.isArray(x)) return 'array';
  return typeof x;
}

export const isMapping = (x: unknown): x is Record<string, unknown> =>
  typeof x === 'object' && x !== null && !Array.isArray(x);

/** Privacy-safe: the type and the sorted key names, never a value. */
export function payloadShape(x: unknown, hash: Hash): PayloadShape {
  const type = payloadType(x);
  const keys = isMapping(x) ? Object.keys(x).sort() : [];
  return {
    payload_type: type,
    payload_keys_count: keys.length,
    payload_fingerprint: hash(`${type}\u0000${keys.join('\u0000')}`).slice(0, 16),
  };
}

/**
 * Whether a parsed payload holds an integer JSON parsing may have rounded (beyond ±2^53: an id such as
 * 1234567890123456789 reads as …800). Such a payload is never executed: the runtime would call the tool with an
 * id that is not the one the agent saw. Iterative, so deep payloads cannot overflow the stack.
 */
export function holdsUnsafeInteger(x: unknown): boolean {
  const stack: unknown[] = [x];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === 'number') {
      if (Number.isInteger(v) && !Number.isSafeInteger(v)) return true;
    } else if (typeof v === 'object' && v !== null) for (const c of Object.values(v)) stack.push(c);
  }
  return false;
}
