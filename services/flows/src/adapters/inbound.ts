import {
  flowCandidateRecordV1,
  TOOL_CALLS_EVENT_TYPES,
  toolCallsEventV1,
} from '../../../../schemas/index.js';
import { zodParser, type Parser } from '../../../../shared/kafka/runner.js';
import type { Inbound } from './engine.js';

/**
 * The service's two input topics decoded into one stream: candidates from `candidatesTopic`, tool-call events
 * from the other (the runner's dead-letter handling takes what neither schema accepts).
 */
export function inboundParser(candidatesTopic: string): Parser<Inbound> {
  const parseCandidate = zodParser(flowCandidateRecordV1);
  const parseEvent = zodParser(toolCallsEventV1, TOOL_CALLS_EVENT_TYPES);
  return (value, topic) => {
    if (topic === candidatesTopic) {
      const p = parseCandidate(value, topic);
      return p.ok ? { ok: true, value: { kind: 'candidate', r: p.value } } : p;
    }
    const p = parseEvent(value, topic);
    return p.ok ? { ok: true, value: { kind: 'event', e: p.value } } : p;
  };
}
