import { describe, expect, it } from 'vitest';
import { compactionProblem } from '../../shared/kafka/topics.js';

describe('a topic that must keep the latest record per key', () => {
  const copy = { topic: 'paver.autoseq-rules.v1', compacted: true };
  const sessions = { topic: 'paver.sequencer-sessions.v1', compacted: true, retentionMs: 86_400_000 };
  it('passes when compacted (alone or with delete), or when nothing expires', () => {
    expect(compactionProblem(copy, { 'cleanup.policy': 'compact' })).toBeNull();
    expect(
      compactionProblem(sessions, { 'cleanup.policy': 'compact, delete', 'retention.ms': '1000' }),
    ).toBeNull();
    expect(compactionProblem(copy, { 'cleanup.policy': 'delete', 'retention.ms': '-1' })).toBeNull();
  });
  it('fails when its records expire, naming the topic, what it has and the policy it needs', () => {
    expect(compactionProblem(copy, { 'cleanup.policy': 'delete', 'retention.ms': '604800000' })).toMatch(
      /^topic paver\.autoseq-rules\.v1 has cleanup\.policy=delete and retention\.ms=604800000: .*set cleanup\.policy=compact /,
    );
    // The broker's defaults when it says nothing: delete after 7 days.
    expect(compactionProblem(sessions, {})).toContain('cleanup.policy=[compact,delete]');
  });
});
