/**
 * Key building blocks. A scope's keys share one hash tag `{…}` so that every key a script touches lands in one
 * Redis Cluster slot; the scope parts are escaped so that user ids cannot break out of the tag or the separator.
 *
 * The escape is reversible, so distinct ids never share a key: `%` and two hex digits for a character up to
 * U+00FF, `%u` and four for the whitespace above it (U+2000 written `%2000` would also read as a space followed
 * by `00`).
 */
export function escapeKeyPart(part: string): string {
  return part.replace(/[%{}:|\s]/g, (c) => {
    const code = c.charCodeAt(0);
    return code > 0xff ? `%u${code.toString(16).padStart(4, '0')}` : `%${code.toString(16).padStart(2, '0')}`;
  });
}

/** The id an escaped part was made from; null when `part` is not something `escapeKeyPart` returns. */
export function unescapeKeyPart(part: string): string | null {
  if (/[{}:|\s]/.test(part)) return null;
  let ok = true;
  const out = part.replace(/%(u[0-9a-f]{4}|[0-9a-f]{2})|%/g, (m, hex: string | undefined) => {
    if (hex === undefined) {
      ok = false;
      return m;
    }
    return String.fromCharCode(parseInt(hex.startsWith('u') ? hex.slice(1) : hex, 16));
  });
  return ok && escapeKeyPart(out) === part ? out : null;
}

export function scopeTag(tenantId: string, agentId: string): string {
  return `{${escapeKeyPart(tenantId)}|${escapeKeyPart(agentId)}}`;
}

/** `text` as a SCAN/KEYS pattern that matches it literally (a key prefix may hold `*`, `?`, `[` or `\`). */
export function globLiteral(text: string): string {
  return text.replace(/[*?[\]\\]/g, (c) => `\\${c}`);
}
