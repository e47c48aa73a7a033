/** Parses Prometheus text exposition (enough for assertions): samples with labels. */
export function parsePrometheus(text: string) {
  const samples: { name: string; labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) throw new Error(`unparseable metrics line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[3] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
      labels[l[1]!] = l[2]!;
    samples.push({ name: m[1]!, labels, value: Number(m[4]) });
  }
  const match = (name: string, want: Record<string, string>) =>
    samples.filter((s) => s.name === name && Object.entries(want).every(([k, v]) => s.labels[k] === v));
  return {
    samples,
    has: (name: string) => samples.some((s) => s.name === name),
    /** Sum over the series matching the labels given. */
    value: (name: string, want: Record<string, string> = {}) =>
      match(name, want).reduce((a, s) => a + s.value, 0),
  };
}
