import { afterAll, describe, expect, it } from 'vitest';
import { consumeUntil, produce, waitFor } from '../../../../test/helpers/kafka.js';
import { startLlmDouble } from '../../../../test/helpers/llm-double.js';
import {
  isReady,
  ROOT,
  serviceEnv,
  startProcess,
  stopPromptly,
  type Proc,
} from '../../../../test/helpers/process.js';
import { createFlowsTopics } from './service-topics.js';

const procs: Proc[] = [];
const closers: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const p of procs) if (p.child.exitCode === null) p.child.kill('SIGKILL');
  for (const c of closers) await c();
});

/** The model's answer: both flows of examples/flows.yaml that the request names. */
const both = (user: string) => {
  const ids = [...user.matchAll(/<flow id="([^"]+)"><name>([^<]+)<\/name>/g)].map((m) => m[1]!);
  return { content: JSON.stringify(ids) };
};

describe('flows service: a stop while a selection waits on the model', () => {
  it('ends the model call: the process stops at once, publishes no fallback, and the request is selected after the restart', async () => {
    // The first model never answers (a hung endpoint); the one after the restart does.
    let hung = true;
    const llm = await startLlmDouble((body) => {
      const user = body.messages.find((m) => m.role === 'user')?.content ?? '';
      return hung ? { ...both(user), delayMs: 600_000 } : both(user);
    });
    closers.push(llm.close);
    const env = serviceEnv({
      FLOWS_GROUP_ID: `fl-slow-${Date.now()}`,
      PAVER_TOPIC_FLOWS: `flows-slow-${Date.now()}`,
      FLOWS_FILE: `${ROOT}examples/flows.yaml`,
      FLOWS_CHAT_URL: llm.url,
      // Budget and shutdown timeout far longer than the test's wait for the exit: only the stop can end the call.
      FLOWS_SELECT_BUDGET_MS: '120000',
      PAVER_SHUTDOWN_TIMEOUT_MS: '120000',
    });
    await createFlowsTopics(env);
    const first = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(first);
    await waitFor(() => isReady(first), 'flows /readyz');

    const request = {
      type: 'user_message',
      event_id: 'slow-1:u',
      ts: Date.now(),
      session_id: 'slow-1',
      task_id: 'slow-1',
      text: 'check my balance and then pay my bill',
    };
    await produce(env.PAVER_TOPIC_TOOL_CALLS!, [{ key: 'slow-1', value: JSON.stringify(request) }]);
    await waitFor(
      () => llm.requests.some((r) => r.path === '/v1/chat/completions'),
      'the selection waiting on the model',
    );

    // Before, the stop waited for the model call (here, past the wait: the exit came only with the timeout).
    expect(await stopPromptly(first)).toBe(0);
    expect(first.output()).toMatch(/batch stopped by the stop or a rebalance/);

    hung = false;
    const second = await startProcess(['bin/paver.js', 'run', 'flows'], env);
    procs.push(second);
    const all = await consumeUntil(env.PAVER_TOPIC_FLOW_SELECTIONS!, (got) =>
      got.some((m) => JSON.parse(m.value!.toString()).path === 'model'),
    );
    // One selection, the model's: the stopped call left no fallback choice behind, and the request was not lost.
    const selections = all.map((m) => JSON.parse(m.value!.toString()) as { event_id: string; path: string });
    expect(selections.map((s) => [s.event_id, s.path])).toEqual([['slow-1:u', 'model']]);
    expect(await stopPromptly(second)).toBe(0);
  });
});
