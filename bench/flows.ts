import { flowDefinitionV1 } from '../schemas/index.js';
import { FlowRegistry, registerManual } from '../services/flows/src/core/registry.js';
import { DEFAULT_POLICY, recall } from '../services/flows/src/core/select.js';
import { rng } from '../testkit/streams.js';
import { pct, quantiles, say, writeResult } from './harness.js';

const WORDS =
  'account balance bill invoice refund order payment card transfer loan report search web summarize parse fetch email notify customer ticket support deploy build test review code database query backup restore schedule meeting calendar travel booking hotel flight cancel update address password reset login security audit export import csv pdf translate document contract sign approve reject escalate'.split(
    ' ',
  );

/** Stage-1 recall over a 10,000-flow registry: the part of selection that runs on every user message. */
export async function benchFlows(flows: number, queries: number) {
  const r = rng(17);
  const phrase = (n: number) =>
    Array.from({ length: n }, () => WORDS[Math.floor(r() * WORDS.length)]).join(' ');
  const reg = new FlowRegistry();
  const t0 = performance.now();
  for (let i = 0; i < flows; i++) {
    reg.upsert(
      registerManual(
        flowDefinitionV1.parse({
          name: `flow_${i}_${phrase(2).replace(/ /g, '_')}`,
          description: phrase(12),
          condition: `The user wants to ${phrase(6)}`,
          desired_effects: [phrase(3), phrase(3)],
        }),
        1,
      ),
    );
  }
  const indexMs = performance.now() - t0;
  const times: number[] = [];
  for (let i = 0; i < queries; i++) {
    const q = `please ${phrase(6)} for me`;
    const s = performance.now();
    recall(reg, 'default', 'default', q, [phrase(8), phrase(8)], DEFAULT_POLICY);
    times.push(performance.now() - s);
  }
  say(
    `flows recall over ${flows}: p50 ${pct(times, 50)?.toFixed(3)} ms, p99 ${pct(times, 99)?.toFixed(3)} ms`,
  );
  writeResult('flows', {
    registry_flows: flows,
    index_build_ms: Math.round(indexMs),
    queries,
    recall_ms: {
      ...quantiles(times),
      definition: 'stage-1 recall (BM25 + RRF, top_k 3, query + 2 episode summaries), in-process',
    },
    targets: { recall_p99_ms_max: 2 },
  });
}
