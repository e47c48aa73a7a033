/**
 * Input validation per record, in-process: JSON.parse alone, then zod's safeParse, then the compiled
 * validator the runner uses (shared/validate.ts), over the same synthetic tool-calls events. CPU only: no
 * Kafka, no Redis.
 */
import { toolCallsEventV1 } from '../schemas/index.js';
import { compile } from '../shared/validate.js';
import { agentEvents } from '../testkit/streams.js';
import { round, say, writeResult } from './harness.js';

export function benchValidate(n: number) {
  const buffers = [...agentEvents({ tasks: Math.ceil(n / 4), seed: 1, agents: 4 })]
    .slice(0, n)
    .map((e) => Buffer.from(JSON.stringify(e)));
  const compiled = compile(toolCallsEventV1);
  if (!compiled) throw new Error('the tool-calls contract no longer compiles');
  // Each variant runs three times; the best run counts (the others absorb JIT warm-up and neighbours).
  const usPerEvent = (fn: (b: Buffer) => unknown) => {
    let best = Infinity;
    for (let k = 0; k < 3; k++) {
      const t = performance.now();
      for (const b of buffers) if (!fn(b)) throw new Error('a valid event was refused');
      best = Math.min(best, performance.now() - t);
    }
    return round((best * 1000) / buffers.length, 2);
  };
  const parse = usPerEvent((b) => JSON.parse(b.toString('utf8')));
  const zod = usPerEvent((b) => toolCallsEventV1.safeParse(JSON.parse(b.toString('utf8'))).success);
  const fast = usPerEvent((b) => compiled(JSON.parse(b.toString('utf8'))));
  say(`validate: JSON.parse ${parse} µs, + zod ${zod} µs, + compiled ${fast} µs per event`);
  writeResult('validate', {
    events: buffers.length,
    us_per_event: { json_parse: parse, json_parse_and_zod: zod, json_parse_and_compiled: fast },
    definition: 'best of three passes over the same tool-calls events, one core, in-process',
  });
}
