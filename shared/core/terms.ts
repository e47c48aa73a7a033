/**
 * The request-term rules: which words of a user's message Paver keeps (never the text). One module, so the
 * detector's candidate request_terms and the flows service's outcome memory speak alike.
 */
/** Distinct terms kept per message: the first ones in text order (a long message never grows the state). */
export const MAX_TERMS_PER_MESSAGE = 32;
const MIN_TERM = 2;
/** Longer words are codes, hashes or glued identifiers rather than words a user would type again. */
const MAX_TERM = 24;

// A general English stop-word list plus the greetings and politeness every chat request starts with:
// they appear in nearly every request, so they would only make unrelated flows look alike.
const STOP_WORDS = new Set(
  (
    'a about above after again against all am an and any are aren as at be because been before being below ' +
    'between both but by can cannot could couldn did didn do does doesn doing don down during each few for ' +
    'from further had hadn has hasn have haven having he her here hers herself him himself his how i if in ' +
    'into is isn it its itself just let ll me more most mustn my myself no nor not now of off on once only ' +
    'or other ought our ours ourselves out over own re same shan she should shouldn so some such than that ' +
    'the their theirs them themselves then there these they this those through to too under until up ve ' +
    'very was wasn we were weren what when where which while who whom why will with won would wouldn you ' +
    'your yours yourself yourselves also get got may might must shall us one two yes yeah ok okay sure ' +
    'hi hello hey dear please thanks thank thx hope hoping im ive id wanna gonna gotta like want wanted ' +
    'need needed help would could today right well really just know think'
  ).split(' '),
);

/** One letter or digit, at `lastIndex`. */
const WORD_CHAR = /[\p{L}\p{N}]/uy;
const wordCharAt = (s: string, i: number): boolean => {
  WORD_CHAR.lastIndex = i;
  return WORD_CHAR.test(s);
};

/**
 * `raw` without the characters at either end that are neither letters nor digits, in one pass over them. A
 * regular expression for the end (`[^\p{L}\p{N}]+$`) is tried from every position of a run that fails to reach
 * it: one 64 KB user message of a word, punctuation and a word cost seconds (quadratic), every time it was read.
 */
export function trimToken(raw: string): string {
  let from = 0;
  while (from < raw.length && !wordCharAt(raw, from)) from += raw.codePointAt(from)! > 0xffff ? 2 : 1;
  let to = raw.length;
  while (to > from) {
    // The start of the last code point before `to` (a surrogate pair is one).
    const last = raw.charCodeAt(to - 1);
    const pair = last >= 0xdc00 && last <= 0xdfff && to - 2 >= from && raw.codePointAt(to - 2)! > 0xffff;
    const at = pair ? to - 2 : to - 1;
    if (wordCharAt(raw, at)) break;
    to = at;
  }
  return raw.slice(from, to);
}

/**
 * Terms of a user's request: lower-cased words without stop words, numbers or identifier-like tokens.
 * A whitespace-separated token is dropped whole when it holds a digit, an `@`, an underscore, a URL
 * scheme, or inner capitals (ids, emails, codes, camelCase names); what is left is split into letter runs.
 * Only these terms are ever stored, never the text.
 */
export function requestTermsOf(text: string): string[] {
  const out: string[] = [];
  const seen = new Set<string>();
  for (const raw of text.normalize('NFKC').split(/\s+/u)) {
    const token = trimToken(raw);
    if (token === '' || token.length > MAX_TERM) continue;
    if (/[\p{N}@_]|:\/\//u.test(token) || /\p{Ll}\p{Lu}|\p{Lu}{2,}\p{Ll}|\p{Lu}\p{Lu}.*\p{Lu}/u.test(token))
      continue;
    for (const m of token.toLowerCase().matchAll(/\p{L}+/gu)) {
      const term = m[0];
      if (term.length < MIN_TERM || term.length > MAX_TERM || STOP_WORDS.has(term) || seen.has(term))
        continue;
      seen.add(term);
      out.push(term);
      if (out.length === MAX_TERMS_PER_MESSAGE) return out;
    }
  }
  return out;
}
