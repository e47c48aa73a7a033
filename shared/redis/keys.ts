/**
 * Key building blocks. A scope's keys share one hash tag `{…}` so that every key a script touches lands in one
 * Redis Cluster slot; the scope parts are escaped so that user ids cannot break out of the tag or the separator.
 */
export function escapeKeyPart(part: string): string {
  return part.replace(/[%{}:|\s]/g, (c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
}

export function scopeTag(tenantId: string, agentId: string): string {
  return `{${escapeKeyPart(tenantId)}|${escapeKeyPart(agentId)}}`;
}
