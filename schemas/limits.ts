/** Input limits enforced by the contracts: bounded memory per event, bounded Redis keys. */
export const LIMITS = {
  idLength: 256,
  toolNameLength: 256,
  textLength: 64 * 1024,
  visibleTools: 10_000,
  summaries: 50,
  maxStep: 1_000_000,
  catalogTools: 10_000,
} as const;
