-- Writes candidates' decision states (and the flows they promote) only if none of those candidates changed
-- since the caller read them: a compare-and-set on each stored text, so two writers deciding the same
-- candidate (a shadow outcome, an operator's reject, a new detector record) never undo each other.
-- KEYS[1] candidates hash, KEYS[2] registry hash.
-- ARGV[1] n; then n triples (dedupe key, text read or '' when it was absent, new text); then pairs (flow id,
-- flow text) for the registry.
-- Returns {1} when written; {0} when a candidate changed (the caller reads again and decides again).
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local cur = redis.call('HGET', KEYS[1], ARGV[2 + i * 3])
  if (cur or '') ~= ARGV[3 + i * 3] then return {0} end
end
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[2 + i * 3], ARGV[4 + i * 3])
end
for j = 2 + n * 3, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[j], ARGV[j + 1])
end
return {1}
