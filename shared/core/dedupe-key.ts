/**
 * A flow candidate's `dedupe_key`: the detector makes it, flows holds candidates and promoted flows by it as an
 * opaque id. Here, in shared/core, so that flows' tests build the detector's keys from the detector's own code
 * rather than a copy that could drift; flows' own code never builds or reads one (a lint rule says so).
 */
export const DEDUPE_PREFIX = 'flow_offload:';

/**
 * A name's part of the key: `%` and `→` percent-encoded (`%25`, `%E2%86%92`), nothing else. Tool names may hold
 * `→`, and ["a→b","c"] shared a key with ["a","b→c"], so flows merged two flows; escaping `%` too makes the key
 * read one way. A name holding neither keeps the reference's key, byte for byte (flows hold candidates by it).
 */
const keyName = (tool: string): string => tool.replace(/%/g, '%25').replace(/→/g, '%E2%86%92');

export const dedupeKeyOf = (tools: readonly string[]): string => DEDUPE_PREFIX + tools.map(keyName).join('→');
