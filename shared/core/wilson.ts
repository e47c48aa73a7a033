/**
 * Wilson score lower bound (z = 1.96 by default) of `hits` successes in `n` trials: what autoseq's rules and
 * flows' shadow trials are promoted on. 0 without trials, and never below 0 (at 0 hits the formula's two terms
 * cancel to within rounding, about -1e-17 for some n, which a bar of 0 would refuse).
 */
export function wilsonLower(hits: number, n: number, z = 1.96): number {
  if (n <= 0) return 0;
  const p = Math.min(1, Math.max(0, hits / n));
  const z2 = z * z;
  const centre = p + z2 / (2 * n);
  const margin = z * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n));
  return Math.max(0, (centre - margin) / (1 + z2 / n));
}
