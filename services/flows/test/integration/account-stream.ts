/**
 * Two flows share the word of a vague request; the one the words favour ('review') is not what agents do for
 * it ('close'). Past outcomes must move the choice after the first runs, so the choices change along the
 * stream, and the live service has to learn exactly as the replay does to give the same ones.
 */
export const FLOWS = [
  {
    name: 'account_review',
    description: 'Help review an account: look it up, audit it, report.',
    condition: 'The user wants help reviewing their account.',
    steps: [
      { name: 'Lookup', skill_key: 'acct_lookup' },
      { name: 'Audit', skill_key: 'acct_audit' },
      { name: 'Report', skill_key: 'acct_report' },
    ],
  },
  {
    name: 'account_close',
    description: 'Close an account: look it up, freeze it, close it.',
    condition: 'The user wants their account closed.',
    steps: [
      { name: 'Lookup', skill_key: 'acct_lookup' },
      { name: 'Freeze', skill_key: 'acct_freeze' },
      { name: 'Close', skill_key: 'acct_close' },
    ],
  },
];

export function stream(): { lines: string[]; requests: number } {
  const lines: string[] = [];
  let ts = 1_700_000_000_000;
  let requests = 0;
  const runs: [string, string[]][] = [];
  for (let i = 0; i < 14; i++) {
    if (i % 4 === 3)
      runs.push([
        'I need a written audit report of my account spending',
        ['acct_lookup', 'acct_audit', 'acct_report'],
      ]);
    else runs.push(['please help with my account', ['acct_lookup', 'acct_freeze', 'acct_close', 'notify']]);
  }
  runs.forEach(([text, tools], i) => {
    const s = `run-${i}`;
    const base = { session_id: s, task_id: s };
    lines.push(JSON.stringify({ type: 'user_message', event_id: `${s}:user`, ...base, ts: ts++, text }));
    requests++;
    tools.forEach((tool, step) =>
      lines.push(
        JSON.stringify({
          type: 'tool_call',
          event_id: `${s}:${step}`,
          ...base,
          step,
          tool,
          args: {},
          ts: ts++,
        }),
      ),
    );
    lines.push(JSON.stringify({ type: 'task_completed', event_id: `${s}:done`, ...base, ts: ts++ }));
  });
  return { lines, requests };
}

/**
 * Runs whose arguments come from earlier outputs and from the request: the order a run acts on is the first
 * of the account's orders, the account is found by the email in the request. `input_map` is learned from it.
 */
export function dataFlowStream(runs: number): string[] {
  const lines: string[] = [];
  let ts = 1_700_000_000_000;
  for (let i = 0; i < runs; i++) {
    const s = `df-${i}`;
    const base = { session_id: s, task_id: s };
    const email = `user${i}@example.com`;
    const order = `O${i}x${(i * 7) % 10}`;
    const text = `I am ${email}, please cancel my latest order`;
    lines.push(JSON.stringify({ type: 'user_message', event_id: `${s}:user`, ...base, ts: ts++, text }));
    const calls: [string, Record<string, unknown>, unknown][] = [
      ['acct_find', { email }, { account_id: `A${i}k`, orders: [order, `O${i}y`] }],
      ['order_get', { order_id: order }, { order_id: order, status: 'open', total: 10 + i }],
      ['order_cancel', { order_id: order, reason: 'customer_request' }, { ok: true }],
    ];
    calls.forEach(([tool, args, observation], step) =>
      lines.push(
        JSON.stringify({
          type: 'tool_call',
          event_id: `${s}:${step}`,
          ...base,
          step,
          tool,
          args,
          observation,
          ts: ts++,
        }),
      ),
    );
    lines.push(JSON.stringify({ type: 'task_completed', event_id: `${s}:done`, ...base, ts: ts++ }));
  }
  return lines;
}
