import type { z } from 'zod';
import { toolCallsEventV1 } from './tool-calls.v1.js';
import { flowCandidateRecordV1 } from './flow-candidates.v1.js';
import { nextActionRecordV1 } from './next-actions.v1.js';
import { sequenceStateRecordV1 } from './sequence-state.v1.js';
import { flowSelectionRecordV1 } from './flow-selections.v1.js';
import { deadLetterRecordV1 } from './dead-letters.v1.js';
import { toolCatalogRecordV1 } from './tool-catalog.v1.js';
import { orchestrationRecordV1 } from './orchestration.v1.js';
import { flowRegistryRecordV1 } from './flows.v1.js';

export * from './tool-calls.v1.js';
export * from './flow-candidates.v1.js';
export * from './next-actions.v1.js';
export * from './sequence-state.v1.js';
export * from './flow-selections.v1.js';
export * from './dead-letters.v1.js';
export * from './tool-catalog.v1.js';
export * from './orchestration.v1.js';
export * from './flows.v1.js';
export { LIMITS } from './limits.js';

/** Every topic contract, by its versioned name: the source for schemas/json and registry subjects. */
export const CONTRACTS: Record<string, { version: number; schema: z.ZodType; io: 'input' | 'output' }> = {
  'tool-calls.v1': { version: 1, schema: toolCallsEventV1, io: 'input' },
  'flow-candidates.v1': { version: 1, schema: flowCandidateRecordV1, io: 'output' },
  'next-actions.v1': { version: 1, schema: nextActionRecordV1, io: 'output' },
  'sequence-state.v1': { version: 1, schema: sequenceStateRecordV1, io: 'output' },
  'flow-selections.v1': { version: 1, schema: flowSelectionRecordV1, io: 'output' },
  'dead-letters.v1': { version: 1, schema: deadLetterRecordV1, io: 'output' },
  'tool-catalog.v1': { version: 1, schema: toolCatalogRecordV1, io: 'input' },
  'orchestration.v1': { version: 1, schema: orchestrationRecordV1, io: 'input' },
  'flows.v1': { version: 1, schema: flowRegistryRecordV1, io: 'output' },
};
