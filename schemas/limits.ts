/** Input limits enforced by the contracts: bounded memory per event, bounded Redis keys. */
export const LIMITS = {
  idLength: 256,
  toolNameLength: 256,
  textLength: 64 * 1024,
  visibleTools: 10_000,
  summaries: 50,
  maxStep: 1_000_000,
  catalogTools: 10_000,
  /**
   * Deepest nesting of a JSON value read at a boundary (a Kafka record, an HTTP body, a line of a file, JSON text
   * in a tool's arguments or result). JSON.parse reads any depth, but writing the value back (JSON.stringify,
   * canonical JSON) overflows the stack from about 5,000 levels: a 10 KB record would stop a consumer on every
   * restart. Real arguments and results nest a few levels; a page's DOM or a syntax tree a tool returns may nest
   * a hundred. Inside an event a payload has one level less (`PAYLOAD_DEPTH`).
   */
  jsonDepth: 256,
} as const;
