import { describe, expect, it } from 'vitest';
import { compactionProblem, retentionShortfall } from '../../../../shared/kafka/topics.js';

const DAY = 86_400_000;
// The session topic as main asks for it, after the operator raised SEQUENCER_SESSION_TTL_MS to 7 days.
const sessions = { topic: 'paver.sequencer-sessions.v1', compacted: true, retentionMs: 7 * DAY };

describe('session topic retention vs SEQUENCER_SESSION_TTL_MS', () => {
  it('an existing compact,delete topic that keeps records for less than the TTL is warned of, not refused', () => {
    // Created by the service with the default TTL (1 day): retention.ms is set only at creation.
    const created = { 'cleanup.policy': 'compact,delete', 'retention.ms': String(DAY) };
    expect(compactionProblem(sessions, created)).toBeNull();
    expect(retentionShortfall(sessions, created)).toBe(
      `topic paver.sequencer-sessions.v1 keeps records retention.ms=${DAY} but this service asks ${7 * DAY} ms: ` +
        `a key not written for ${DAY} ms goes, and a restore after a Redis loss brings back less; raise it ` +
        '(kafka-configs.sh --alter --entity-type topics --entity-name paver.sequencer-sessions.v1 --add-config ' +
        `retention.ms=${7 * DAY})`,
    );
  });

  it('says nothing when the topic keeps them long enough, for good, or never deletes', () => {
    const ok = [
      { 'cleanup.policy': 'compact,delete', 'retention.ms': String(7 * DAY) },
      { 'cleanup.policy': 'compact, delete', 'retention.ms': String(30 * DAY) },
      { 'cleanup.policy': 'compact,delete', 'retention.ms': '-1' },
      { 'cleanup.policy': 'compact', 'retention.ms': '1000' },
    ];
    for (const config of ok) expect(retentionShortfall(sessions, config), JSON.stringify(config)).toBeNull();
    // A topic that asks no retention (compacted only) is never short.
    expect(
      retentionShortfall(
        { topic: 'x', compacted: true },
        { 'cleanup.policy': 'compact,delete', 'retention.ms': '1' },
      ),
    ).toBeNull();
    // The broker's default when it says nothing: 7 days, enough here, short for a 30-day TTL.
    expect(retentionShortfall(sessions, { 'cleanup.policy': 'compact,delete' })).toBeNull();
    expect(
      retentionShortfall({ ...sessions, retentionMs: 30 * DAY }, { 'cleanup.policy': 'compact,delete' }),
    ).toContain('retention.ms=604800000');
  });
});
