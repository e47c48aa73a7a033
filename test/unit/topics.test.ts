import { describe, expect, it } from 'vitest';
import { classifyError } from '../../shared/errors.js';
import { compactionProblem } from '../../shared/kafka/topics.js';
import { authorizationRefused } from '../../shared/service.js';

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
    // Kept forever by age, but cut by size: a key's latest record still goes.
    expect(
      compactionProblem(copy, {
        'cleanup.policy': 'delete',
        'retention.ms': '-1',
        'retention.bytes': '1073741824',
      }),
    ).toContain('has cleanup.policy=delete and retention.bytes=1073741824');
  });
  it('passes a topic with no cleanup at all (an empty policy)', () => {
    expect(compactionProblem(copy, { 'cleanup.policy': '', 'retention.ms': '1000' })).toBeNull();
  });
});

describe('a broker that will not describe topic configs to this client', () => {
  it('is told from other failures by the protocol error type kafkajs keeps, also once classified', () => {
    const refused = Object.assign(new Error('Topic authorization failed'), {
      name: 'KafkaJSProtocolError',
      type: 'TOPIC_AUTHORIZATION_FAILED',
      retriable: false,
    });
    expect(authorizationRefused(refused)).toBe(true);
    expect(authorizationRefused(classifyError(refused))).toBe(true);
    const down = Object.assign(new Error('Connection timeout'), {
      name: 'KafkaJSConnectionError',
      retriable: true,
    });
    expect(authorizationRefused(classifyError(down))).toBe(false);
    expect(authorizationRefused(new TypeError('x is not a function'))).toBe(false);
  });
});
