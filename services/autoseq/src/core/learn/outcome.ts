/**
 * Whether a tool's output reports a failure, by the conventions tools commonly follow: a string that starts
 * with an error word ("Error: user not found") or tells one ("User not found"), or an object flagging one (`error`, `errors`, `ok: false`,
 * `success: false`, `isError: true`, `status: "error"`). What an agent does after a failed call (retry with other arguments,
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

/** The last string judged: one event asks about the same last output for every context it builds. */
let lastText: string | null = null;
let lastFailed = false;

export function failedOutput(observation: unknown): boolean {
  if (typeof observation === 'string') {
    if (observation !== lastText) {
      lastFailed =
        ERROR_TEXT.test(observation.slice(0, 64)) || FAILURE_PHRASE.test(observation.slice(0, 160));
      lastText = observation;
    }
    return lastFailed;
  }
  if (observation === null || typeof observation !== 'object' || Array.isArray(observation)) return false;
  const o = observation as Record<string, unknown>;
  const truthy = (v: unknown) => v !== undefined && v !== null && v !== false && v !== '';
  if (truthy(o.error)) return true;
  if (Array.isArray(o.errors) ? o.errors.length > 0 : truthy(o.errors)) return true;
  // MCP's tool result says it with `isError`.
  if (o.ok === false || o.success === false || o.isError === true) return true;
  return typeof o.status === 'string' && /^(error|failed|failure)$/i.test(o.status);
}

// Whether an output mentions a word of the request is a binding question too (which element of a list the
// user meant): the rule lives with the bindings, shared.
export { mentionsRequest } from '../../../../../shared/core/mentions.js';
