import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { toolCallsEventV1, type ToolCallsEvent } from '../../../schemas/index.js';
import { rng } from '../../../testkit/streams.js';
import type { LearnOptions } from '../src/core/learn/learner.js';
import { replay } from '../src/learn-cli.js';

/** The 30 tau2 airline runs the autoseq tests learn from. */
export const FIXTURE_30 = join(import.meta.dirname, 'fixtures/tau2-airline-30.jsonl');

/** The fixture's events, each through the event contract. */
export const fixtureEvents = (): ToolCallsEvent[] =>
  readFileSync(FIXTURE_30, 'utf8')
    .trim()
    .split('\n')
    .map((l) => toolCallsEventV1.parse(JSON.parse(l)) as ToolCallsEvent);

/** `paver predict`'s output lines for a file (the offline replay, without a catalog), as the command prints them. */
export async function predictLines(file: string, opts: LearnOptions): Promise<string[]> {
  const out: string[] = [];
  await replay(
    file,
    opts,
    null,
    (l) => out.push(JSON.stringify(l)),
    () => undefined,
  );
  return out;
}

/** Seeded, so that every run sees the same streams. */
export function prng(seed: number) {
  const next = rng(seed);
  return { next, int: (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1)) };
}

/** Tasks whose ids come in later user messages, with failures, walks and redelivered events, interleaved. */
export function learnStream(seed: number, tasks: number): ToolCallsEvent[] {
  const r = prng(seed);
  let ts = 1;
  const all: ToolCallsEvent[][] = [];
  for (let i = 0; i < tasks; i++) {
    const id = `t${i}`;
    const base = () => ({ ts: ts++, tenant_id: 'default', agent_id: 'default', session_id: id, task_id: id });
    const ev: ToolCallsEvent[] = [];
    let step = 0;
    let said = 0;
    const user = (text: string) =>
      ev.push({ ...base(), type: 'user_message', event_id: `${id}:u${said++}`, text });
    const call = (tool: string, args: Record<string, unknown>, observation: unknown) =>
      ev.push({
        ...base(),
        type: 'tool_call',
        event_id: `${id}:${step}`,
        step: step++,
        tool,
        args,
        observation,
      });
    const order = `#W${r.int(1000000, 9999999)}`;
    const items = Array.from({ length: r.int(1, 3) }, (_, k) => `I${i}-${k}`);
    user(r.next() < 0.5 ? 'Hi, I need help with an order.' : `Hello, a question about my kettle.`);
    call('list_options', { q: `x${r.int(0, 9)}` }, { options: r.int(0, 5) });
    if (r.next() < 0.7) user(`Sure, it is order ${order}, the kettle one.`);
    call('get_order', { order_id: order }, r.next() < 0.1 ? 'Error: order not found' : { id: order, items });
    for (const it of items)
      call('get_item', { item_id: it }, { id: it, name: r.next() < 0.3 ? 'kettle' : 'lamp' });
    if (r.next() < 0.5) user('Yes please, go ahead.');
    call('return_items', { order_id: order, item_ids: items.slice(0, 1) }, 'ok');
    ev.push({ ...base(), type: 'task_completed', event_id: `${id}:end` });
    all.push(ev);
  }
  // Three tasks at a time, and now and then an event read again (a redelivery).
  const out: ToolCallsEvent[] = [];
  for (let i = 0; i < all.length; i += 3) {
    const group = all.slice(i, i + 3);
    const n = Math.max(...group.map((g) => g.length));
    for (let j = 0; j < n; j++)
      for (const g of group) {
        if (!g[j]) continue;
        out.push(g[j]!);
        if (r.next() < 0.05) out.push(g[r.int(0, j)]!);
      }
  }
  return out;
}
