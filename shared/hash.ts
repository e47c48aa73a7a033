import { createHash } from 'node:crypto';

/** Hex SHA-256: the digest the pure cores receive for fingerprints and deterministic ids. */
export const sha256 = (text: string): string => createHash('sha256').update(text).digest('hex');
