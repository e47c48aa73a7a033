/**
 * Whether a tool's output (or a part of one) mentions a word of the user's request. Two callers: autoseq's
 * learner keeps contexts apart by it (what an agent does after a record that mentions what the user said
 * differs), and the bindings pick the element of a list that mentions it (the item the user named).
 * Pure and deterministic (memoised on derived data only).
 */
/** Most words of an output or a request searched (bounds the work on huge outputs). */
const MAX_WORDS = 4096;
const WORD = /[\p{L}\p{N}]+/gu;
/**
 * English function words: present in most requests and most prose outputs, they would mark nearly every
 * context and tell nothing about whether the output is what the user asked for.
 */
const STOP = new Set(
  (
    'the and for you your are was were has have had with this that not but can all from his her our out any ' +
    'its they them then there their what when where which who will would could should been into also just ' +
    "than too very can't don't please thanks thank hello yes"
  ).split(' '),
);

/**
 * The distinct words (≥ 3 characters, at least one letter, lower-cased) of a text, in a set. NFKC first, as request
 * terms are, so canonically equal text gives the same words ("café" composed or with a combining accent);
 * ASCII, nearly every output, needs none.
 */
function words(text: string, into: Set<string>): void {
  // eslint-disable-next-line no-control-regex -- the ASCII range, control characters included
  const plain = /^[\u0000-\u007f]*$/.test(text) ? text : text.normalize('NFKC');
  for (const m of plain.matchAll(WORD)) {
    if (into.size >= MAX_WORDS) return;
    const w = m[0].toLowerCase();
    if (w.length >= 3 && /\p{L}/u.test(w) && !STOP.has(w)) into.add(w);
  }
}

/** Words of the user's request, memoised (the same first message is read for every call of its task). */
let lastText: string | null = null;
let lastWords = new Set<string>();
function requestWords(text: string): Set<string> {
  if (text !== lastText) {
    lastWords = new Set();
    words(text, lastWords);
    lastText = text;
  }
  return lastWords;
}

/**
 * Whether a tool's output mentions a word of the user's request (any string inside it, or its keys' values
 * only: keys are the tool's vocabulary, not the user's). An agent that walks a list of records looking for the
 * one the user means tends to stop when a record mentions what the user said: what it does next differs,
 * so the learner keeps the two apart, as it does after a failure.
 */
export function mentionsRequest(observation: unknown, userText: string | undefined): boolean {
  if (!userText) return false;
  // Asked several times per event for the same last output (context keys, the store's partial load):
  // memoised per output object and request (derived data only, so answers stay deterministic).
  if (observation !== null && typeof observation === 'object') {
    const m = mentionMemo.get(observation);
    if (m?.text === userText) return m.result;
    const result = searchMentions(observation, userText);
    mentionMemo.set(observation, { text: userText, result });
    return result;
  }
  if (typeof observation !== 'string') return false;
  if (observation !== lastOutput || userText !== lastOutputText) {
    lastResult = searchMentions(observation, userText);
    lastOutput = observation;
    lastOutputText = userText;
  }
  return lastResult;
}

const mentionMemo = new WeakMap<object, { text: string; result: boolean }>();
let lastOutput: string | null = null;
let lastOutputText: string | null = null;
let lastResult = false;

function searchMentions(observation: unknown, userText: string): boolean {
  const asked = requestWords(userText);
  if (asked.size === 0) return false;
  const seen = new Set<string>();
  let budget = MAX_WORDS;
  const visit = (v: unknown): boolean => {
    if (budget-- <= 0) return false;
    if (typeof v === 'string') {
      seen.clear();
      words(v, seen);
      for (const w of seen) if (asked.has(w)) return true;
      return false;
    }
    if (v === null || typeof v !== 'object') return false;
    for (const x of Array.isArray(v) ? v : Object.values(v)) if (visit(x)) return true;
    return false;
  };
  return visit(observation);
}
