import { LIMITS } from '../../schemas/limits.js';

/**
 * True when `v` nests objects or arrays deeper than `max` levels (a scalar is depth 0, `[]` depth 1). The walk
 * stops at `max + 1` levels, so its own recursion is bounded whatever the value.
 */
export function deeperThan(v: unknown, max: number = LIMITS.jsonDepth): boolean {
  return v !== null && typeof v === 'object' && tooDeep(v, 1, max);
}

function tooDeep(v: object, depth: number, max: number): boolean {
  if (depth > max) return true;
  if (Array.isArray(v)) {
    for (const x of v)
      if (x !== null && typeof x === 'object' && tooDeep(x as object, depth + 1, max)) return true;
    return false;
  }
  for (const k in v) {
    const x = (v as Record<string, unknown>)[k];
    if (x !== null && typeof x === 'object' && tooDeep(x, depth + 1, max)) return true;
  }
  return false;
}

/**
 * The deepest a tool's arguments or result may nest where Paver builds the event around them (ingest, an offline
 * file's arguments given as JSON text): the event holds them one level down, and is checked whole by every
 * service that reads it.
 */
export const PAYLOAD_DEPTH = LIMITS.jsonDepth - 1;

/** The dead-letter detail (and error text) for such a value: the limit, never the value. */
export const TOO_DEEP = `nested deeper than ${LIMITS.jsonDepth} levels`;
