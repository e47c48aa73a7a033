// One hash for the learner's ids and fingerprints and the sequencer's event-id marks (shared/core/fnv.ts).
export { fnv64 } from '../../../../../shared/core/fnv.js';
