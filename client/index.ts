/**
 * The `paver` package as a library: a typed publisher for agent runtimes, the topic contracts (zod schemas
 * and their types), and the offline cores for in-process use. `import { createPublisher } from 'paver'`.
 */
export {
  createPublisher,
  DEFAULT_TOOL_CALLS_TOPIC,
  DEFAULT_MAX_MESSAGE_BYTES,
  MAX_OPEN_TASKS,
  MAX_UNREPORTED_FAILURES,
  type Publisher,
  type PublisherOptions,
  type ToolCallInput,
  type UserMessageInput,
  type TaskCompletedInput,
} from './publisher.js';
export {
  detect,
  select,
  DEFAULT_DETECTOR_PARAMS,
  DEFAULT_SELECT_POLICY,
  type DetectResult,
  type ScopeCandidates,
  type SelectOptions,
  type DetectorParams,
  type SelectPolicy,
  type Selection,
} from './offline.js';
// `predict` (the next-action core) is not exported yet: its in-process entry point is being written.
export * from '../schemas/index.js';
export { PaverError, type ErrorCode } from '../shared/errors.js';
