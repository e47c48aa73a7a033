import { describe, expect, it } from 'vitest';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import { applyEvent, MemoryLearnStore } from '../../src/core/learn/engine.js';
import { DEFAULT_LEARN, listRules, type LearnOptions, type RuleView } from '../../src/core/learn/learner.js';
import { SavingsCounter, type SavingsReport } from '../../src/core/learn/savings.js';

/**
 * Generality audit: synthetic streams of the deterministic patterns a real agent domain exhibits, with generic
 * tool names and values that vary across tasks (a seeded PRNG), run through the core with its defaults. Each
 * pattern must end with an active rule whose proposals cover a meaningful share of its calls at ≥ 95%
 * precision (counting warm-up); a pattern that holds only 70% of the time must never be promoted.
 */

/** mulberry32: a small seeded PRNG, so that every run sees the same stream. */
function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)]!;
  const digits = (n: number) => Array.from({ length: n }, () => String(int(0, 9))).join('');
  return { next, int, pick, digits };
}
type Rng = ReturnType<typeof prng>;

const FIRST = ['yusuf', 'mia', 'noah', 'olivia', 'ethan', 'sofia', 'liam', 'ava', 'lucas', 'emma', 'omar'];
const LAST = ['rossi', 'garcia', 'brown', 'kim', 'silva', 'nguyen', 'smith', 'patel', 'lopez', 'ito'];
const cap = (s: string) => s[0]!.toUpperCase() + s.slice(1);

interface Person {
  first: string;
  last: string;
  id: string;
  email: string;
  zip: string;
}
function person(r: Rng): Person {
  const first = r.pick(FIRST);
  const last = r.pick(LAST);
  const email = r.pick([
    () => `${first}.${last}${r.digits(4)}@example.com`,
    () => `${first}${r.digits(2)}@mail.net`,
    () => `${first}_${last}@corp.example.org`,
  ])();
  return { first, last, id: `${first}_${last}_${r.digits(4)}`, email, zip: r.digits(5) };
}
const orderId = (r: Rng) => `#W${r.digits(7)}`;

/** Builds one task's events (user message, calls, completion) with increasing ts across the whole stream. */
let ts = 1;
class TaskBuilder {
  readonly events: ToolCallsEvent[] = [];
  private step = 0;
  constructor(readonly id: string) {}
  private base() {
    return { ts: ts++, tenant_id: 'default', agent_id: 'default', session_id: this.id, task_id: this.id };
  }
  private said = 0;
  user(text: string): this {
    const n = this.said++;
    this.events.push({
      ...this.base(),
      type: 'user_message',
      event_id: n === 0 ? `${this.id}:u` : `${this.id}:u${n}`,
      text,
    });
    return this;
  }
  call(tool: string, args: Record<string, unknown>, observation: unknown): this {
    const step = this.step++;
    this.events.push({
      ...this.base(),
      type: 'tool_call',
      event_id: `${this.id}:${step}`,
      step,
      tool,
      args,
      observation,
    });
    return this;
  }
  end(): ToolCallsEvent[] {
    this.events.push({ ...this.base(), type: 'task_completed', event_id: `${this.id}:end` });
    return this.events;
  }
}

/** Calls no rule can predict: varied tools, arguments and outputs (what an agent does around a pattern). */
function noise(t: TaskBuilder, r: Rng, n: number): void {
  for (let i = 0; i < n; i++) {
    const tool = r.pick(['think', 'search_docs', 'list_categories', 'get_policy', 'calculate', 'get_time']);
    t.call(tool, { q: `${r.pick(FIRST)} ${r.digits(3)}` }, { text: `note ${r.digits(6)}`, n: r.int(0, 99) });
  }
}

interface Outcome {
  report: SavingsReport;
  rules: RuleView[];
}

/** Replays tasks (interleaved two at a time, as sessions overlap in a real stream) and tallies savings. */
function simulate(tasks: ToolCallsEvent[][], opts: LearnOptions = DEFAULT_LEARN): Outcome {
  const order: ToolCallsEvent[] = [];
  for (let i = 0; i < tasks.length; i += 2) {
    const a = tasks[i]!;
    const b = tasks[i + 1] ?? [];
    for (let j = 0; j < Math.max(a.length, b.length); j++) {
      if (a[j]) order.push(a[j]!);
      if (b[j]) order.push(b[j]!);
    }
  }
  const store = new MemoryLearnStore();
  const savings = new SavingsCounter();
  for (const e of order) {
    const r = applyEvent(store, e, opts);
    if (!r || r.duplicate) continue;
    if (e.type === 'tool_call') savings.add(e.tool, r.held, r.heldHit);
    else if (e.type === 'task_completed') savings.add(null, r.held, false);
  }
  return { report: savings.report(), rules: listRules(store.scope('default', 'default')) };
}

/**
 * The pattern's tool ends with an active rule, and its active proposals cover at least `coverage` of its
 * calls (warm-up included) at ≥ 95% precision; overall precision (every active proposal) is ≥ 95% too.
 */
function expectLearned(o: Outcome, tool: string, coverage: number): void {
  const active = o.rules.filter((r) => r.tool === tool && r.state === 'active');
  const t = o.report.per_tool[tool]!;
  const detail = JSON.stringify({ tool: t, overall: o.report.overall, rules: o.rules.slice(0, 6) });
  expect(active.length, detail).toBeGreaterThan(0);
  expect(t.hits / t.tool_calls, detail).toBeGreaterThanOrEqual(coverage);
  expect(t.precision!, detail).toBeGreaterThanOrEqual(0.95);
  expect(o.report.overall.precision!, detail).toBeGreaterThanOrEqual(0.95);
}

const TASKS = 120;

describe('learned decider: generality over synthetic domains', () => {
  it('a. argument = the previous call’s whole output, a plain (non-JSON) string', () => {
    const r = prng(1);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`a${i}`).user(
        r.pick([`Hi, I need to change an order.`, `Hello there, can you help me with a refund?`]),
      );
      noise(t, r, r.int(0, 1));
      t.call('lookup_id', { key: `${p.first}-${r.digits(3)}` }, p.id);
      t.call('get_record', { user_id: p.id }, { name: { first: p.first }, zip: p.zip });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_record', 0.5);
  });

  it('b. argument = a nested field of the previous JSON output', () => {
    const r = prng(2);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`b${i}`).user(`Please look into my account.`);
      noise(t, r, r.int(0, 1));
      const acct = `A${r.digits(8)}`;
      t.call(
        'get_record',
        { user_id: p.id },
        { profile: { name: p.first, billing: { account_id: acct, zip: p.zip } }, created: r.digits(6) },
      );
      t.call('get_account', { account_id: acct }, { balance: r.int(0, 999) });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_account', 0.5);
  });

  it('b2. the same, with outputs handed over as JSON text (as most agent frameworks pass them on)', () => {
    const r = prng(2);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`b2-${i}`).user(`Please look into my account.`);
      noise(t, r, r.int(0, 1));
      const acct = `A${r.digits(8)}`;
      const orders = Array.from({ length: r.int(1, 3) }, () => orderId(r));
      t.call(
        'get_record',
        { user_id: p.id },
        JSON.stringify(
          { profile: { name: p.first, billing: { account_id: acct, zip: p.zip } }, orders },
          null,
          r.pick([0, 2]),
        ),
      );
      t.call('get_account', { account_id: acct }, JSON.stringify({ balance: r.int(0, 999) }));
      for (const o of orders)
        t.call('get_order', { order_id: o }, JSON.stringify({ id: o, total: r.int(1, 99) }));
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    const o = simulate(tasks);
    expectLearned(o, 'get_account', 0.5);
    expectLearned(o, 'get_order', 0.4);
  });

  it('b4. the same, with outputs encoded twice (JSON text of the JSON text, as some frameworks pass them on)', () => {
    const r = prng(4);
    const twice = (v: unknown) => JSON.stringify(JSON.stringify(v));
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`b4-${i}`).user(`Please look into my account.`);
      noise(t, r, r.int(0, 1));
      const acct = `A${r.digits(8)}`;
      t.call(
        'get_record',
        { user_id: p.id },
        twice({ profile: { name: p.first, billing: { account_id: acct } } }),
      );
      t.call('get_account', { account_id: acct }, twice({ balance: r.int(0, 999) }));
      // A quoted plain string stays a string (the quotes are the value's).
      t.call('note', { text: 'done' }, JSON.stringify('ok'));
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_account', 0.5);
  });

  it('b3. the same, with outputs as MCP tool results (JSON text in content[0].text; isError on a failure)', () => {
    const r = prng(3);
    const mcp = (v: unknown) => ({ content: [{ type: 'text', text: JSON.stringify(v) }] });
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`b3-${i}`).user(`Please look into my account.`);
      noise(t, r, r.int(0, 1));
      if (r.next() < 0.3) {
        // A failed lookup, told only by isError: what follows it is not the deterministic step.
        t.call(
          'get_record',
          { user_id: `${p.first}_x` },
          { content: [{ type: 'text', text: 'no' }], isError: true },
        );
        noise(t, r, 1);
      }
      const acct = `A${r.digits(8)}`;
      t.call(
        'get_record',
        { user_id: p.id },
        mcp({ profile: { name: p.first, billing: { account_id: acct } } }),
      );
      t.call('get_account', { account_id: acct }, mcp({ balance: r.int(0, 999) }));
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_account', 0.5);
  });

  it('c1. loop over a list of strings from an earlier output, in list order', () => {
    const r = prng(3);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(1, 4) }, () => orderId(r));
      const t = new TaskBuilder(`c${i}`).user(`Where is my package? I'm ${cap(p.first)}.`);
      t.call('get_record', { user_id: p.id }, { name: p.first, orders, zip: p.zip });
      for (const o of orders)
        t.call('get_item', { order_id: o }, { order_id: o, status: r.pick(['pending', 'delivered']) });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_item', 0.5);
  });

  it('c2. loop over a list of objects, the argument being element.field', () => {
    const r = prng(4);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(1, 4) }, () => ({
        id: orderId(r),
        total: r.int(10, 500),
      }));
      const t = new TaskBuilder(`c2${i}`).user(`I want to check my orders.`);
      t.call('get_record', { user_id: p.id }, { name: p.first, orders });
      for (const o of orders) t.call('get_item', { order_id: o.id }, { status: r.pick(['a', 'b', 'c']) });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_item', 0.5);
  });

  it('c3. loop over short lists: the next element follows less often than not, but always while one is left', () => {
    const r = prng(12);
    const tasks = Array.from({ length: 150 }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.next() < 0.6 ? 1 : 2 }, () => orderId(r));
      const t = new TaskBuilder(`c3${i}`).user(`Where is my package?`);
      t.call('get_record', { user_id: p.id }, { name: p.first, orders });
      for (const o of orders)
        t.call('get_item', { order_id: o }, { status: r.pick(['pending', 'delivered']) });
      noise(t, r, r.int(1, 2));
      return t.end();
    });
    // The first element alone is ~70% of the calls, ~38 of them warm-up: the second must be proposed too,
    // though after a first element the walk goes on only ~30% of the time.
    expectLearned(simulate(tasks), 'get_item', 0.55);
  });

  // The first call of a task has no context: what the user said is bound from the second call on.
  for (const [name, value, say] of [
    [
      'emails',
      (p: Person) => p.email,
      (r: Rng, v: string) =>
        r.pick([
          `Hi, my email is ${v}. I want to return something.`,
          `Hello! I can't log in. You can find me under ${v}, thanks`,
          `${v} here, I have a question about a refund.`,
        ]),
    ],
    [
      'order ids',
      (_p: Person, r: Rng) => orderId(r),
      (r: Rng, v: string) =>
        r.pick([
          `Hi, I want to cancel order ${v} please.`,
          `My order ${v} arrived broken. I'd like an exchange.`,
          `Can you check ${v}? It is late. Order placed 3 weeks ago.`,
        ]),
    ],
    [
      'zip codes',
      (p: Person) => p.zip,
      (r: Rng, v: string) =>
        r.pick([
          `Hi, I moved. My zip is ${v} now, I want 2 items shipped there.`,
          `Hello. I live at ${v} and need to update my address.`,
        ]),
    ],
    [
      'names',
      (p: Person) => cap(p.first),
      (r: Rng, v: string) =>
        r.pick([`Hi, I'm ${v} and I need help.`, `Hello! My name is ${v}. I have a problem with an order.`]),
    ],
  ] as const) {
    it(`d. argument = a token of the user’s first message (${name})`, () => {
      const r = prng(5 + name.length);
      const tasks = Array.from({ length: TASKS }, (_, i) => {
        const p = person(r);
        const v = value(p, r);
        const t = new TaskBuilder(`d${i}`).user(say(r, v));
        t.call('get_policy', { topic: 'general' }, { text: `policy ${r.digits(4)}` });
        t.call('lookup_id', { key: v }, p.id);
        noise(t, r, r.int(0, 2));
        return t.end();
      });
      expectLearned(simulate(tasks), 'lookup_id', 0.5);
    });
  }

  it('e. mixed: one argument from an earlier output plus one constant', () => {
    const r = prng(6);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const pid = r.digits(10);
      const t = new TaskBuilder(`e${i}`).user(`I want to exchange a product.`);
      t.call('get_record', { user_id: p.id }, { name: p.first });
      t.call(
        'get_order',
        { order_id: orderId(r) },
        { items: [{ name: 'lamp', product_id: pid, item_id: r.digits(10) }], status: 'delivered' },
      );
      t.call('get_item', { product_id: pid, detail: 'full' }, { variants: r.int(1, 9) });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_item', 0.5);
  });

  it('f. the deterministic step follows a failed call and a retry with another tool', () => {
    const r = prng(7);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`f${i}`).user(
        `Hi, I'm ${cap(p.first)} ${cap(p.last)}, my email is ${p.email}, zip ${p.zip}.`,
      );
      if (r.next() < 0.5) {
        t.call('lookup_by_email', { email: p.email }, 'Error: user not found');
        t.call('lookup_by_name', { first: cap(p.first), last: cap(p.last), zip: p.zip }, p.id);
      } else t.call('lookup_by_email', { email: p.email }, p.id);
      t.call('get_record', { user_id: p.id }, { name: p.first, orders: [orderId(r)] });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    const o = simulate(tasks);
    // get_record follows two contexts (a good lookup, a retry after a failed one), half the tasks each, with the
    // same recipe (the previous output's id): its family is proven on the trials of both (about twice as fast
    // as either context alone), and each rule then needs eight trials of its own. Without families each
    // context paid its warm-up (~36 trials at the bar) on its own: 29% of the calls, against 59%.
    expectLearned(o, 'get_record', 0.5);
    // The retry's arguments are tokens of the request (names among them): it is learned after the failure
    // too, from its ~55 occurrences (~38 of them warm-up).
    expectLearned(o, 'lookup_by_name', 0.15);
  });

  it('f2. a failure told in a sentence that does not open with an error word is kept apart too', () => {
    const r = prng(13);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`f2${i}`).user(`Hello, I need to update my address.`);
      if (r.next() < 0.25) {
        t.call('lookup_id', { email: p.email }, r.pick(['User not found', 'No user found with that email.']));
        t.call('lookup_id', { email: `${p.first}@mail.net` }, p.id);
      } else t.call('lookup_id', { email: p.email }, p.id);
      t.call('get_record', { user_id: p.id }, { name: p.first, zip: p.zip });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_record', 0.5);
  });

  it('g. a pair A → B behind varied calls: the k = 1 rule acts though longer contexts are scattered', () => {
    const r = prng(8);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`g${i}`).user(`Question about my subscription.`);
      noise(t, r, r.int(0, 3));
      const sub = `S${r.digits(6)}`;
      t.call('lookup_id', { key: p.email }, { subscription: sub });
      t.call('get_record', { subscription_id: sub }, { plan: r.pick(['basic', 'pro']) });
      noise(t, r, r.int(0, 3));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_record', 0.55);
  });

  it('i. a loop interleaved with a call per element (get_item, then get_product of the item’s product)', () => {
    const r = prng(10);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(1, 4) }, () => orderId(r));
      const t = new TaskBuilder(`i${i}`).user(`I want to exchange something I bought.`);
      t.call('lookup_id', { email: p.email }, p.id);
      t.call('get_record', { user_id: p.id }, { name: p.first, orders });
      for (const o of orders) {
        const pid = r.digits(10);
        t.call('get_item', { order_id: o }, { items: [{ product_id: pid, item_id: r.digits(10) }] });
        t.call('get_product', { product_id: pid }, { name: r.pick(['lamp', 'desk', 'mug']) });
      }
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    const o = simulate(tasks);
    expectLearned(o, 'get_record', 0.5);
    expectLearned(o, 'get_item', 0.4);
    expectLearned(o, 'get_product', 0.5);
  });

  it('k. a list walk that stops at the record that mentions what the user asked for', () => {
    const r = prng(11);
    const products = ['lamp', 'kettle', 'backpack', 'headphones', 'keyboard', 'blender', 'tent', 'jacket'];
    const tasks = Array.from({ length: 150 }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(2, 5) }, () => ({ id: orderId(r), what: r.pick(products) }));
      const want = r.int(0, orders.length - 1);
      const wanted = orders[want]!.what;
      const t = new TaskBuilder(`k${i}`).user(
        `Hi, the ${wanted} I ordered is broken and I want to return it.`,
      );
      t.call('get_record', { user_id: p.id }, { orders: orders.map((x) => x.id) });
      for (const o of orders) {
        t.call('get_item', { order_id: o.id }, { item: o.what, status: 'delivered' });
        if (o.what === wanted) break;
      }
      t.call('return_items', { order_id: orders.find((x) => x.what === wanted)!.id, reason: 'broken' }, 'ok');
      return t.end();
    });
    const o = simulate(tasks);
    expectLearned(o, 'get_item', 0.3);
    expectLearned(o, 'return_items', 0.3);
  });

  it('m. the element the user named when they named one, else the walk from the first', () => {
    const r = prng(14);
    const tasks = Array.from({ length: 150 }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(2, 4) }, () => orderId(r));
      const named = r.next() < 0.4 ? r.pick(orders) : null;
      const t = new TaskBuilder(`m${i}`).user(
        named
          ? `Hi, I want to return order ${named}, it arrived damaged.`
          : `Hi, I want to return something.`,
      );
      t.call('get_record', { user_id: p.id }, { name: p.first, orders });
      if (named) t.call('get_item', { order_id: named }, { status: 'delivered' });
      else for (const o of orders) t.call('get_item', { order_id: o }, { status: 'delivered' });
      noise(t, r, r.int(1, 2));
      return t.end();
    });
    // Refined by whether the record mentions the request, the first call is exact on both sides (the named
    // element / the list's first), each side proving itself on its own trials; a walk's second step follows
    // the same tools as a named fetch's noise, so it is learned only from the third step's contexts on.
    expectLearned(simulate(tasks), 'get_item', 0.3);
  });

  it('p. argument = a field of the list element that mentions what the user asked for', () => {
    const r = prng(16);
    const products = ['lamp', 'kettle', 'backpack', 'headphones', 'keyboard', 'blender', 'tent', 'jacket'];
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const names = [...products].sort(() => r.next() - 0.5).slice(0, r.int(2, 4));
      const items = names.map((name) => ({
        name,
        product_id: r.digits(10),
        item_id: r.digits(10),
        price: r.int(5, 300),
      }));
      const want = r.pick(items);
      const t = new TaskBuilder(`p${i}`).user(
        r.pick([
          `Hi, I want to exchange the ${want.name} from my last order.`,
          `My ${want.name} broke. Can you help?`,
        ]),
      );
      const oid = orderId(r);
      t.call('get_record', { user_id: p.id }, { orders: [oid] });
      t.call('get_order', { order_id: oid }, { items, status: 'delivered' });
      t.call('get_product', { product_id: want.product_id }, { variants: r.int(1, 5) });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    expectLearned(simulate(tasks), 'get_product', 0.5);
  });

  it('s. argument = a token of the user’s later message (the answer when the agent asked), used after a lookup', () => {
    const r = prng(41);
    const tasks = Array.from({ length: TASKS }, (_, i) => {
      const p = person(r);
      const order = orderId(r);
      const t = new TaskBuilder(`s${i}`).user(
        r.pick([
          'Hi, I need help with an order.',
          'Hello! Something went wrong with my purchase.',
          'I want to return an item.',
        ]),
      );
      t.call('get_policy', { topic: 'returns' }, { text: `policy ${r.digits(4)}` });
      // What the first message did not hold: the user gives it once asked.
      t.user(
        r.pick([
          `It's ${p.email}, and the order is ${order}.`,
          `Sure: ${p.email}. Order ${order}.`,
          `My email is ${p.email} and my order number is ${order}`,
        ]),
      );
      t.call('find_user_by_email', { email: p.email }, p.id);
      t.call(
        'get_order',
        { order_id: order },
        { status: r.pick(['delivered', 'pending']), items: r.int(1, 4) },
      );
      noise(t, r, r.int(1, 3));
      return t.end();
    });
    const o = simulate(tasks);
    // Before, a message after the first was not read: the order number had no source, and no rule was made.
    expectLearned(o, 'get_order', 0.5);
    // The lookup right after the answer: proposed again once the message came (the proposal made at the call
    // before it had no email to give).
    expectLearned(o, 'find_user_by_email', 0.5);
    expect(o.rules.find((x) => x.tool === 'get_order' && x.state === 'active')?.bindings).toEqual([
      { path: ['order_id'], source: 'said' },
    ]);
  });

  it('z. a whole customer-service-like domain: ≥ 10% of all calls at ≥ 95% precision, warm-up included', () => {
    const r = prng(15);
    const products = ['lamp', 'kettle', 'backpack', 'headphones', 'keyboard', 'blender', 'tent', 'jacket'];
    const tasks = Array.from({ length: 150 }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(1, 4) }, () => ({
        id: orderId(r),
        what: r.pick(products),
        pid: r.digits(10),
        item: r.digits(10),
      }));
      const want = r.pick(orders);
      const t = new TaskBuilder(`z${i}`).user(
        r.pick([
          `Hi! I want to return the ${want.what} I bought.`,
          `Hello, my ${want.what} is broken. Can I exchange it? My email is ${p.email}.`,
          `Hi, I'm ${cap(p.first)} ${cap(p.last)} and I need help with my ${want.what}.`,
        ]),
      );
      if (r.next() < 0.3) {
        t.call('lookup_by_email', { email: p.email }, 'Error: user not found');
        t.call('lookup_by_name', { first: cap(p.first), last: cap(p.last), zip: p.zip }, p.id);
      } else if (r.next() < 0.7) t.call('lookup_by_email', { email: p.email }, p.id);
      else t.call('lookup_by_name', { first: cap(p.first), last: cap(p.last), zip: p.zip }, p.id);
      if (r.next() < 0.15) noise(t, r, 1);
      t.call(
        'get_record',
        { user_id: p.id },
        { name: { first: p.first }, zip: p.zip, orders: orders.map((o) => o.id) },
      );
      for (const o of orders) {
        t.call(
          'get_item',
          { order_id: o.id },
          { items: [{ name: o.what, product_id: o.pid, item_id: o.item }] },
        );
        if (o === want) break;
      }
      if (r.next() < 0.6) t.call('get_product', { product_id: want.pid }, { variants: r.int(1, 5) });
      noise(t, r, r.int(0, 2));
      if (r.next() < 0.7)
        t.call('return_items', { order_id: want.id, item_ids: [want.item], reason: 'broken' }, 'ok');
      return t.end();
    });
    const o = simulate(tasks);
    expect(o.report.overall.precision!, JSON.stringify(o.report.overall)).toBeGreaterThanOrEqual(0.95);
    expect(o.report.overall.coverage, JSON.stringify(o.report.overall)).toBeGreaterThanOrEqual(0.1);
  });

  it('q. a longer context’s proven exception wins over the shorter context’s rule where both are active', () => {
    const r = prng(17);
    const tasks = Array.from({ length: 1500 }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`q${i}`).user(`Hello, a question about my account.`);
      const acct = `A${r.digits(8)}`;
      // 5% of the time the record was reached through an archive lookup: then its history is fetched instead.
      const archived = r.next() < 0.05;
      if (archived) t.call('lookup_archive', { key: p.email }, { found: true, n: r.int(1, 9) });
      else noise(t, r, r.int(0, 1));
      t.call('get_record', { user_id: p.id }, { account_id: acct });
      t.call(archived ? 'get_history' : 'get_account', { account_id: acct }, { ok: 1 });
      noise(t, r, r.int(0, 1));
      return t.end();
    });
    const o = simulate(tasks);
    expectLearned(o, 'get_account', 0.8);
    expectLearned(o, 'get_history', 0.1);
    // Once the exception is proven, the shorter context's rule no longer answers for it.
    expect(o.report.per_tool.get_account!.precision!).toBeGreaterThanOrEqual(0.97);
  });

  it('r. what follows a step depends on what the user asked for: proven on the requests it serves', () => {
    const r = prng(21);
    const products = ['lamp', 'kettle', 'backpack', 'headphones', 'keyboard', 'tent'];
    const tasks = Array.from({ length: 200 }, (_, i) => {
      const p = person(r);
      const orders = Array.from({ length: r.int(1, 3) }, () => orderId(r));
      const what = r.pick(products);
      // A third of the users want to buy: the agent then searches the catalogue instead of opening orders.
      const buy = r.next() < 0.33;
      const t = new TaskBuilder(`r${i}`).user(
        buy
          ? r.pick([
              `Hi, I'd like to buy a ${what}.`,
              `Can I purchase a new ${what}?`,
              `Looking to buy a ${what} today.`,
            ])
          : r.pick([`Where is my ${what}?`, `My ${what} arrived broken.`, `I want to return my ${what}.`]),
      );
      t.call('get_record', { user_id: p.id }, { orders });
      if (buy) t.call('search_catalog', { query: what }, { hits: [r.digits(6)] });
      else t.call('get_order', { order_id: orders[0]! }, { status: 'delivered' });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    // Without exceptions "get_record > get_order(first order)" hits two times in three and is never proven.
    expectLearned(simulate(tasks), 'get_order', 0.15);
  });

  it('h. a next tool that follows only 70% of the time is never promoted', () => {
    const r = prng(9);
    const tasks = Array.from({ length: 200 }, (_, i) => {
      const p = person(r);
      const t = new TaskBuilder(`h${i}`).user(`Help with my account please.`);
      const acct = `A${r.digits(8)}`;
      t.call('get_record', { user_id: p.id }, { account_id: acct });
      if (r.next() < 0.7) t.call('get_account', { account_id: acct }, { ok: 1 });
      else t.call('get_history', { account_id: acct }, { ok: 1 });
      noise(t, r, r.int(0, 2));
      return t.end();
    });
    const o = simulate(tasks);
    expect(o.rules.filter((x) => x.state !== 'shadow')).toEqual([]);
    expect(o.report.overall.active_proposals).toBe(0);
  });
});
