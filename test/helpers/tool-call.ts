/** Tool call `i` of session 's' (task 't'), at step `i`: a record the tool-calls contract accepts. */
export const toolCall = (i: number) => ({
  type: 'tool_call',
  event_id: `e${i}`,
  ts: 1_700_000_000_000 + i,
  session_id: 's',
  task_id: 't',
  step: i,
  tool: 'search',
});
