import { describe, expect, it } from 'vitest';
import { flowDefinitionV1 } from '../../../../schemas/index.js';
import { FlowRegistry, registerManual } from '../../src/core/registry.js';

/** The n-th flow id (ids are UUIDs). */
const fid = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;
const flow = (id: string, tenant: string, description = 'refund an order') =>
  registerManual(
    flowDefinitionV1.parse({
      id,
      tenant_id: tenant,
      agent_id: 'a',
      name: `flow ${id}`,
      description,
      condition: 'the user wants money back',
      desired_effects: ['refunded'],
    }),
    1,
  );

describe('flow registry', () => {
  it('keeps the embedding of a flow published again unchanged, and drops it when its text changed', () => {
    const r = new FlowRegistry();
    r.upsert(flow(fid(1), 't'));
    r.setVector('t', 'a', fid(1), [1, 0]);
    // Every start publishes the hand-written flows again, and every instance reads them: before, each read
    // dropped the vector, and the embedder was called again for every flow.
    r.upsert(flow(fid(1), 't'));
    expect(r.missingVectors()).toEqual([]);
    expect(r.index('t', 'a')!.vectors.get(fid(1))).toEqual([1, 0]);
    r.upsert(flow(fid(1), 't', 'cancel an order'));
    expect(r.missingVectors().map((f) => f.id)).toEqual([fid(1)]);
  });

  it('an id upserted into another scope is listed there only, and removed from there', () => {
    const r = new FlowRegistry();
    for (let i = 0; i < 50; i++) r.upsert(flow(fid(i), `t${i}`));
    r.upsert(flow(fid(7), 'other'));
    expect(r.list('t7', 'a')).toEqual([]);
    expect(r.list('other', 'a').map((f) => f.id)).toEqual([fid(7)]);
    expect(r.size).toBe(50);
    expect(r.remove(fid(7))?.tenant_id).toBe('other');
    expect(r.list('other', 'a')).toEqual([]);
    expect(r.remove(fid(7))).toBeUndefined();
    expect(r.size).toBe(49);
  });
});
