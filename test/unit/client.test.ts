import { describe, expect, it, vi } from 'vitest';
import { logLevel, type Producer } from 'kafkajs';
import { rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import {
  createPublisher,
  detect,
  select,
  DEFAULT_DETECTOR_PARAMS,
  PaverError,
  MAX_OPEN_TASKS,
  MAX_UNREPORTED_FAILURES,
  type ToolCallInput,
} from '../../client/index.js';
import { detect as detectFile } from '../../services/detector/src/cli.js';
import { liveCandidates } from '../../services/detector/src/core/detect.js';
import { freePort } from '../../deploy/local/stack.js';
import { waitFor } from '../helpers/kafka.js';
import { producerDouble } from '../helpers/producer-double.js';

describe('client: createPublisher (validation happens before any connection)', () => {
  // Port 9 (discard): nothing is listening; none of these calls may reach the network.
  const pub = () => createPublisher({ brokers: ['127.0.0.1:9'], lingerMs: 60_000 });

  it('needs brokers or a producer', () => {
    expect(() => createPublisher({})).toThrow(PaverError);
  });

  it('refuses options Kafka or the services would refuse later, naming them', () => {
    const make = (o: object) => () => createPublisher({ brokers: ['127.0.0.1:9'], ...o });
    expect(make({ batchSize: 0 })).toThrow(/batchSize/);
    expect(make({ lingerMs: -1 })).toThrow(/lingerMs/);
    expect(make({ topic: 'tool calls' })).toThrow(/topic/);
    expect(make({ tenantId: '' })).toThrow(/tenantId/);
    expect(make({ maxMessageBytes: 1.5 })).toThrow(/maxMessageBytes/);
    expect(make({ topic: 'paver.tool-calls.v1', batchSize: 10, lingerMs: 0 })).not.toThrow();
  });

  it('rejects events that break the tool-calls contract, with the field named', async () => {
    const p = pub();
    await expect(p.toolCall({ session_id: '', task_id: 't', tool: 'x' })).rejects.toThrow(/session_id/);
    await expect(p.toolCall({ session_id: 's', task_id: 't', tool: 'x', step: -1 })).rejects.toThrow(/step/);
    await expect(
      p.userMessage({ session_id: 's', text: 'x'.repeat(1_000_000) } as never),
    ).rejects.toMatchObject({ code: 'INPUT_INVALID' });
    // Not JSON (a database driver's BigInt, a circular object): refused as invalid, as the contract refuses.
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    for (const observation of [{ rows: 3n }, circular])
      await expect(
        p.toolCall({ session_id: 's', task_id: 't', tool: 'x', observation }),
      ).rejects.toMatchObject({
        code: 'INPUT_INVALID',
        message: expect.stringMatching(/not JSON/) as unknown,
      });
    // Each refusal reached the caller through the call it awaited: close() does not report them again.
    await expect(p.close()).resolves.toBeUndefined();
    await expect(p.taskCompleted({ session_id: 's', task_id: 't' })).rejects.toMatchObject({
      code: 'SHUTTING_DOWN',
    });
  });

  it('counts steps for at most MAX_OPEN_TASKS tasks: a task never completed does not keep its entry for ever', async () => {
    const { producer, sent } = producerDouble<{ step?: number; task_id: string }>();
    const p = createPublisher({ producer, batchSize: 10_000 });
    const call = (task: string) => void p.toolCall({ session_id: 's', task_id: task, tool: 'x' });
    call('old');
    call('kept');
    for (let i = 0; i < MAX_OPEN_TASKS - 1; i++) {
      call(`t${i}`);
      if (i === MAX_OPEN_TASKS / 2) call('kept');
    }
    call('old');
    call('kept');
    await p.close();
    const steps = (task: string) => sent.filter((e) => e.task_id === task).map((e) => e.step);
    // 'old' went unused for MAX_OPEN_TASKS other tasks: its count started again; 'kept' was used meanwhile.
    expect(steps('old')).toEqual([0, 0]);
    expect(steps('kept')).toEqual([0, 1, 2]);
  });

  it('a call refused for its size takes no step: the next call of the task gets the step it would have had', async () => {
    const { producer, sent } = producerDouble<{ step?: number; tool: string }>();
    const p = createPublisher({ producer, maxMessageBytes: 1_000 });
    const call = (tool: string, observation?: string) =>
      p.toolCall({ session_id: 's', task_id: 't', tool, ...(observation ? { observation } : {}) });
    await call('a');
    await expect(call('big', 'x'.repeat(2_000))).rejects.toMatchObject({ code: 'INPUT_INVALID' });
    await call('b');
    // Unawaited too: the refusal is known at the call, before the next call takes its step.
    void call('c');
    void call('big', 'x'.repeat(2_000));
    void call('d');
    await expect(p.close()).rejects.toMatchObject({ code: 'INPUT_INVALID' });
    // Before: b went out with step 2 (and d with 4), and the services read a step missing from the task.
    expect(sent.map((e) => [e.tool, e.step])).toEqual([
      ['a', 0],
      ['b', 1],
      ['c', 2],
      ['d', 3],
    ]);
  });

  it('a call whose send failed gives its step back: its retry gets the step it had, and the task counts on from there', async () => {
    const double = producerDouble<{ step?: number; tool: string; type: string }>();
    const { sent } = double;
    const p = createPublisher({ producer: double.producer, lingerMs: 0 });
    const call = (tool: string) => p.toolCall({ session_id: 's', task_id: 't', tool });
    await call('a');
    double.failures = 1;
    await expect(call('b')).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await call('b');
    // Three calls in one failed send (unawaited, as a fire-and-forget agent makes them): all three steps back.
    double.failures = 1;
    const burst = [call('c'), call('d'), call('e')];
    await expect(p.flush()).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    for (const b of burst) await expect(b).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await call('c');
    // A task end that was not published does not end the count either.
    double.failures = 1;
    await expect(p.taskCompleted({ session_id: 's', task_id: 't' })).rejects.toMatchObject({
      code: 'KAFKA_UNAVAILABLE',
    });
    await call('d');
    // Every failure above reached the caller through its call's promise: close() has none left to report.
    await expect(p.close()).resolves.toBeUndefined();
    expect(sent.map((e) => [e.tool, e.step])).toEqual([
      ['a', 0],
      ['b', 1],
      ['c', 2],
      ['d', 3],
    ]);
  });

  it('reports each failure once: to the call whose promise the caller took up, otherwise by the next flush()', async () => {
    const double = producerDouble();
    const p = createPublisher({ producer: double.producer, lingerMs: 0 });
    const call = (tool: string, session = 's') => p.toolCall({ session_id: session, task_id: 't', tool });
    // Awaited: the call's rejection is the report. Before, flush() rejected with the same failure again.
    double.failures = 1;
    await expect(call('a')).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(p.flush()).resolves.toBeUndefined();
    // A handler attached (a logging .catch) is taken up too, and so is an invalid call that was awaited.
    double.failures = 1;
    const logged: unknown[] = [];
    const handled = call('b').catch((err: unknown) => logged.push(err));
    await expect(p.toolCall({ session_id: 's', task_id: 't', tool: '' })).rejects.toMatchObject({
      code: 'INPUT_INVALID',
    });
    await p.flush();
    await handled;
    expect(logged).toMatchObject([{ code: 'KAFKA_UNAVAILABLE' }]);
    // Fire and forget: flush() reports it, once; the next flush() has nothing to say.
    double.failures = 1;
    void call('c');
    await expect(p.flush()).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(p.flush()).resolves.toBeUndefined();
    // Unawaited calls with one awaited among them: flush() reports the ones the caller did not take up.
    double.failures = 1;
    const awaited = call('d');
    void call('e', 'other');
    await expect(awaited).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(p.close()).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
  });

  it("a fire-and-forget caller's session stays held after a failed send until flush() has reported it", async () => {
    const double = producerDouble<{ tool: string; step: number }>();
    const { sent } = double;
    const p = createPublisher({ producer: double.producer, lingerMs: 0 });
    const call = (tool: string, session = 's') => p.toolCall({ session_id: session, task_id: 't', tool });
    double.failures = 1;
    const lost = call('a');
    await waitFor(() => double.failures === 0, 'the send to fail');
    // Nobody has heard of the failure yet: the session's next events fail too, other sessions go on.
    const later = [call('b'), call('c')];
    await call('x', 'other');
    await expect(p.flush()).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    for (const l of [lost, ...later]) await expect(l).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    // Reported: the session goes out again, from the step that failed.
    await call('a');
    await call('b');
    await p.close();
    expect(sent.map((e) => [e.tool, e.step])).toEqual([
      ['x', 0],
      ['a', 0],
      ['b', 1],
    ]);
  });

  it('keeps at most MAX_UNREPORTED_FAILURES failed calls for flush(): past it a call is let go, and flush() still reports a failure and frees the session', async () => {
    // Part of the package's API (docs/client.md gives the number): a caller sizes its flush() cadence by it.
    expect(MAX_UNREPORTED_FAILURES).toBe(1_000);
    // The publisher's memory is what is tested: a collected call is one it no longer keeps.
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    // Every send refused until the outage ends.
    const double = producerDouble<{ tool: string; step: number }>();
    const { sent } = double;
    double.failures = Infinity;
    const p = createPublisher({ producer: double.producer, lingerMs: 0 });
    const call = (tool: string) => p.toolCall({ session_id: 's', task_id: 't', tool });
    const extra = 500;
    // A fire-and-forget agent calling on through an outage: nothing takes these calls up.
    const fire = () => {
      const calls = Array.from({ length: MAX_UNREPORTED_FAILURES + extra }, (_, i) => call(`c${i}`));
      // Waits for them without taking them up (Promise.prototype.then, not the call's own).
      const settled = Promise.all(calls.map((c) => Promise.prototype.then.call(c, undefined, () => 0)));
      return {
        kept: calls.slice(0, MAX_UNREPORTED_FAILURES),
        refs: calls.map((c) => new WeakRef(c)),
        settled,
      };
    };
    const { kept, refs, settled } = fire();
    await settled;
    await new Promise((r) => setImmediate(r));
    gc();
    await new Promise((r) => setImmediate(r));
    // Before: every failed call stayed in memory until the next flush(), however many.
    const alive = refs.filter((r) => r.deref() !== undefined).length;
    expect(alive).toBe(MAX_UNREPORTED_FAILURES);
    // Even with every kept call taken up, flush() reports a failure: those past the bound were not.
    for (const k of kept) await expect(k).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(p.flush()).rejects.toMatchObject({ code: 'KAFKA_UNAVAILABLE' });
    await expect(p.flush()).resolves.toBeUndefined();
    // Reported: the session goes out again, from the step that failed.
    double.failures = 0;
    await call('a');
    await call('b');
    await p.close();
    expect(sent.map((e) => [e.tool, e.step])).toEqual([
      ['a', 0],
      ['b', 1],
    ]);
  });

  it("a field given as undefined is left out: it gets the publisher's default, and the task's steps count on", async () => {
    const { producer, sent } = producerDouble();
    const p = createPublisher({ producer, tenantId: 'acme', agentId: 'bot' });
    // What a wrapper passing its own optional values through writes.
    const given: { tenant?: string; agent?: string; id?: string; ts?: number } = {};
    await p.toolCall({
      session_id: 's',
      task_id: 't',
      tool: 'a',
      tenant_id: given.tenant,
      agent_id: given.agent,
      event_id: given.id,
      ts: given.ts,
    });
    await p.toolCall({ session_id: 's', task_id: 't', tool: 'b', tenant_id: 'acme' });
    // Without publisher defaults, the contract's 'default' scope given or left out is one task.
    const q = createPublisher({ producer });
    await q.toolCall({ session_id: 's', task_id: 'u', tool: 'c' });
    await q.toolCall({ session_id: 's', task_id: 'u', tool: 'd', tenant_id: 'default', agent_id: 'default' });
    await Promise.all([p.close(), q.close()]);
    expect(sent.map((e) => [e.tool, e.tenant_id, e.agent_id, e.step])).toEqual([
      ['a', 'acme', 'bot', 0],
      ['b', 'acme', 'bot', 1],
      ['c', 'default', 'default', 0],
      ['d', 'default', 'default', 1],
    ]);
    expect(typeof sent[0]!.event_id).toBe('string');
    expect(typeof sent[0]!.ts).toBe('number');
  });

  it('a second close() waits for the first one: it resolves only once the queued events are acknowledged', async () => {
    const sent: unknown[] = [];
    let ack: (() => void) | null = null;
    // A producer double whose acknowledgement the test gives: this test is about close()'s promise.
    const producer = {
      send: (r: { messages: unknown[] }) =>
        new Promise((resolve) => {
          ack = () => {
            sent.push(...r.messages);
            resolve([]);
          };
        }),
    } as unknown as Producer;
    const p = createPublisher({ producer });
    void p.toolCall({ session_id: 's', task_id: 't', tool: 'x' });
    const first = p.close();
    // A shutdown handler and the end of main() both closing: before, the second resolved at once, with the
    // event still unacknowledged, and a process that exited on it lost the event.
    let secondDone = false;
    const second = p.close().then(() => (secondDone = true));
    await waitFor(() => ack !== null, 'the send to start');
    expect(secondDone).toBe(false);
    ack!();
    await Promise.all([first, second]);
    expect(sent).toHaveLength(1);
  });

  it("its own producer writes nothing into the user's process: a failed send is the call's rejection, not a kafkajs log line", async () => {
    const port = await freePort(); // nothing listens there: every connection is refused
    const failedSend = async (kafka: object) => {
      const written: unknown[][] = [];
      const spies = (['log', 'info', 'warn', 'error'] as const).map((m) =>
        vi.spyOn(console, m).mockImplementation((...args: unknown[]) => void written.push(args)),
      );
      try {
        const p = createPublisher({
          brokers: [`127.0.0.1:${port}`],
          kafka: { retry: { retries: 0 }, connectionTimeout: 1_000, ...kafka },
          lingerMs: 0,
        });
        await expect(p.toolCall({ session_id: 's', task_id: 't', tool: 'x' })).rejects.toMatchObject({
          code: 'KAFKA_UNAVAILABLE',
        });
        await p.close();
      } finally {
        for (const s of spies) s.mockRestore();
      }
      return written.flat().join('\n');
    };
    // Before: kafkajs's own ERROR lines ('[Connection] Connection error: connect ECONNREFUSED …') on stderr.
    expect(await failedSend({})).toBe('');
    // Asked for, they are there.
    expect(await failedSend({ logLevel: logLevel.ERROR })).toContain('ECONNREFUSED');
  });

  it('fills event_id, ts and step; the input type leaves them optional', () => {
    const call: ToolCallInput = { session_id: 's', task_id: 't', tool: 'x' };
    expect(call.step).toBeUndefined();
  });
});

describe('client: offline cores in-process', () => {
  const events = (tasks: number, tools: string[]) =>
    Array.from({ length: tasks }, (_, t) => [
      ...tools.map((tool, step) => ({
        type: 'tool_call',
        event_id: `e-${t}-${step}`,
        ts: t * 1000 + step,
        session_id: `s${t}`,
        task_id: `t${t}`,
        step,
        tool,
      })),
      {
        type: 'task_completed',
        event_id: `c-${t}`,
        ts: t * 1000 + 999,
        session_id: `s${t}`,
        task_id: `t${t}`,
      },
    ]).flat();

  it('detect finds a repeated sequence and counts invalid events', () => {
    const r = detect([...events(4, ['a', 'b', 'c']), { type: 'tool_call' }]);
    expect(r.invalid).toBe(1);
    expect(r.scopes).toHaveLength(1);
    expect(r.scopes[0]?.candidates.map((c) => c.tool_sequence)).toContainEqual(['a', 'b', 'c']);
    expect(detect(events(2, ['a', 'b', 'c'])).scopes[0]?.candidates).toEqual([]);
    expect(() => detect([], { minLength: 0 })).toThrow(PaverError);
  });

  it("detect's candidates carry the terms of users' requests, as paver detect's and the service's do", async () => {
    const withRequests = Array.from({ length: 4 }, (_, t) => [
      {
        type: 'user_message',
        event_id: `u-${t}`,
        ts: t * 1000,
        session_id: `s${t}`,
        task_id: `t${t}`,
        text: 'please refund the invoice of my order',
      },
      ...events(4, ['a', 'b', 'c']).filter((e) => e.task_id === `t${t}`),
    ]).flat();
    const [candidate] = detect(withRequests).scopes[0]!.candidates;
    // Before: { tasks: 0, terms: [] }, and a description without the requests' words.
    expect(candidate?.request_terms?.tasks).toBe(4);
    expect(candidate?.request_terms?.terms.map((t) => t.term)).toEqual(['invoice', 'order', 'refund']);
    // The same candidates as `paver detect` over the same events.
    const file = join(tmpdir(), `client-detect-${process.pid}.jsonl`);
    writeFileSync(file, withRequests.map((e) => JSON.stringify(e)).join('\n') + '\n');
    try {
      const cli = await detectFile(file, DEFAULT_DETECTOR_PARAMS, {}, () => undefined);
      const scope = cli.state.scopesSeen()[0]!;
      expect(detect(withRequests).scopes[0]!.candidates).toEqual(
        liveCandidates(
          cli.state.frequentStats(scope),
          DEFAULT_DETECTOR_PARAMS,
          cli.state.windowRecords(scope),
        ),
      );
    } finally {
      rmSync(file, { force: true });
    }
    // And none when they are turned off.
    expect(
      detect(withRequests, { requestTerms: false }).scopes[0]!.candidates[0]?.request_terms,
    ).toBeUndefined();
  });

  it('select recalls the flow that matches the query, without a model', () => {
    const flows = [
      {
        name: 'Refund an order',
        description: 'refund a paid order to the card',
        steps: [{ name: 'Find Order' }, { name: 'Refund' }],
      },
      {
        name: 'Change address',
        description: 'update the shipping address',
        steps: [{ name: 'Find User' }, { name: 'Update' }],
      },
    ];
    const s = select(flows, 'I want a refund for my order', { policy: { topK: 1 } });
    expect(s.chosen.map((c) => c.name)).toEqual(['Refund an order']);
    expect(s.combined_prompt).toContain('Refund');
    expect(select(flows, 'please change my shipping address').chosen[0]?.name).toBe('Change address');
    expect(() => select([{ name: '' }], 'x')).toThrow(/flow 0/);
  });
});
