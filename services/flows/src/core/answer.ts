/**
 * Ids from a model's answer: a JSON array of ids (or of `{id}` objects, or `{ "ids": [...] }`), possibly in
 * code fences or surrounded by prose. Returns null when no array can be recovered (the caller falls back).
 */
export function parseIds(answer: string): string[] | null {
  const text = answer
    .replace(/```[a-zA-Z]*\s*/g, '')
    .replace(/```/g, '')
    .trim();
  const candidates: string[] = [text];
  // Every bracketed span, outermost first: prose around the array, or several arrays, still parse.
  for (let i = text.indexOf('['); i >= 0; i = text.indexOf('[', i + 1)) {
    const j = text.lastIndexOf(']');
    if (j > i) candidates.push(text.slice(i, j + 1));
    const k = text.indexOf(']', i);
    if (k > i) candidates.push(text.slice(i, k + 1));
  }
  for (const c of candidates) {
    let v: unknown;
    try {
      v = JSON.parse(c);
    } catch {
      continue;
    }
    if (v && typeof v === 'object' && !Array.isArray(v) && Array.isArray((v as { ids?: unknown }).ids))
      v = (v as { ids: unknown[] }).ids;
    if (!Array.isArray(v)) continue;
    const ids = v
      .map((x) =>
        typeof x === 'string'
          ? x
          : x && typeof x === 'object' && typeof (x as { id?: unknown }).id === 'string'
            ? (x as { id: string }).id
            : null,
      )
      .filter((x): x is string => x !== null)
      .map((x) => x.trim())
      .filter(Boolean);
    if (ids.length === v.length) return [...new Set(ids)];
  }
  return null;
}
