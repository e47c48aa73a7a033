import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPublisher } from '../../client/index.js';
import { producerDouble } from '../helpers/producer-double.js';
import { startRegistryDouble } from '../helpers/registry-double.js';

type Registry = Awaited<ReturnType<typeof startRegistryDouble>>;

describe('client publisher with a schema registry (registry double, producer double)', () => {
  let reg: Registry;
  beforeAll(async () => {
    reg = await startRegistryDouble();
  });
  afterAll(async () => {
    await reg.close();
  });

  /** A publisher to a topic of its own through the registry double, and the events its producer double sent. */
  const publisher = (name: string) => {
    // The registry's wire format puts the magic byte and the schema id before each event's JSON.
    const { sent, producer } = producerDouble<{ tool?: string; step?: number }>(5);
    const p = createPublisher({
      producer,
      schemaRegistry: reg.url,
      topic: `${name}-${Date.now()}`,
      lingerMs: 0,
    });
    return { p, sent };
  };

  it("queues a session's events in call order, whatever each one's encode waits for", async () => {
    const { p, sent } = publisher('order');
    const calls: Promise<void>[] = [];
    let n = 0;
    // Calls one microtask apart, from before the schema id is known until after: some wait for the
    // registration, the later ones find the id cached.
    const first = p.toolCall({ session_id: 's', task_id: 't', tool: `c${n++}` });
    calls.push(first);
    let done = false;
    void first.then(() => (done = true));
    while (!done) {
      calls.push(p.toolCall({ session_id: 's', task_id: 't', tool: `c${n++}` }));
      await (n % 2 ? Promise.resolve() : new Promise((r) => setImmediate(r)));
    }
    for (let i = 0; i < 20; i++) {
      calls.push(p.toolCall({ session_id: 's', task_id: 't', tool: `c${n++}` }));
      await Promise.resolve();
    }
    await Promise.all(calls);
    await p.close();
    expect(sent.map((e) => e.tool)).toEqual(Array.from({ length: n }, (_, i) => `c${i}`));
    expect(sent.map((e) => e.step)).toEqual(Array.from({ length: n }, (_, i) => i));
  });

  it('holds a session after its event failed to encode (registry down): no later event of it goes out, and the retry gets the steps the calls had', async () => {
    const { p, sent } = publisher('hold');
    const call = (tool: string, session = 's') => p.toolCall({ session_id: session, task_id: 't', tool });
    reg.setDown(true);
    const lost = [call('a'), call('b')];
    // Waits for the failure without taking the promise up (an unawaited call, as a fire-and-forget agent has).
    await Promise.allSettled(lost.map((l) => Promise.prototype.then.call(l, undefined, () => undefined)));
    reg.setDown(false);
    // Nobody has heard of the failures yet: the session's next event fails too, other sessions go on.
    const later = call('c');
    await call('x', 'other');
    await expect(p.flush()).rejects.toMatchObject({ code: 'REGISTRY_UNAVAILABLE' });
    for (const l of [...lost, later]) await expect(l).rejects.toMatchObject({ code: 'REGISTRY_UNAVAILABLE' });
    // Reported: the session goes out again, from the step that failed.
    await call('a');
    await call('b');
    await p.close();
    // Before: c went out with step 1 (a's step 0 never did), and the retries then counted on from 2.
    expect(sent.map((e) => [e.tool, e.step])).toEqual([
      ['x', 0],
      ['a', 0],
      ['b', 1],
    ]);
  });
});
