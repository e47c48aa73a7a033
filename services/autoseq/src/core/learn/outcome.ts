/**
 * Whether a tool's output reports a failure, by the conventions tools commonly follow: a string that starts
 * with an error word ("Error: user not found") or tells one ("User not found"), or an object flagging one (`error`, `errors`, `ok: false`,
 * `success: false`, `status: "error"`). What an agent does after a failed call (retry with other arguments,
 * ask the user, give up) differs from what it does after a good one, and a binding to a failed call's output
 * would feed an error message into the next call: the learner keeps the two apart.
 */
const ERROR_TEXT =
  /^\s*[[(]?\s*(error|exception|failed|failure|invalid|unable|cannot|can't|not found|unknown)\b/i;

/**
 * A failure told in a sentence that does not open with an error word ("User not found", "No user found with
 * that email", "Order #W1 does not exist"): phrases no good output of a lookup or an action carries.
 */
const FAILURE_PHRASE =
  /\b(not found|no such|does not exist|doesn't exist|do not exist|could not|couldn't|unable to|declined|denied|not allowed|not authori[sz]ed|forbidden)\b|^\s*no\b[^.\n]{0,40}\bfound\b/i;

export function failedOutput(observation: unknown): boolean {
  if (typeof observation === 'string')
    return ERROR_TEXT.test(observation.slice(0, 64)) || FAILURE_PHRASE.test(observation.slice(0, 160));
  if (observation === null || typeof observation !== 'object' || Array.isArray(observation)) return false;
  const o = observation as Record<string, unknown>;
  const truthy = (v: unknown) => v !== undefined && v !== null && v !== false && v !== '';
  if (truthy(o.error)) return true;
  if (Array.isArray(o.errors) ? o.errors.length > 0 : truthy(o.errors)) return true;
  if (o.ok === false || o.success === false) return true;
  return typeof o.status === 'string' && /^(error|failed|failure)$/i.test(o.status);
}

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

/** The distinct words (≥ 3 characters, at least one letter, lower-cased) of a text, in a set. */
function words(text: string, into: Set<string>): void {
  for (const m of text.matchAll(WORD)) {
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
