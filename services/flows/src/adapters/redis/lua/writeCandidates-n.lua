-- Writes candidates' decision states (and the flows they promote) only if none of those candidates changed
-- since the caller read them: a compare-and-set on each stored text, so two writers deciding the same
-- candidate (a shadow outcome, an operator's reject, a new detector record) never undo each other. A shadow
-- outcome ends its session in the same write, so a redelivered end neither counts the trial again nor loses it.
-- KEYS[1] candidates hash, KEYS[2] registry hash, KEYS[3..] session keys to mark ended.
-- ARGV[1] n, ARGV[2] m; then n triples (dedupe key, text read or '' when it was absent, new text); then m pairs
-- (flow id, flow text) for the registry; then, per session key, its ended state, TTL ms and end position
-- ("<partition>:<offset>").
-- Returns {1} when written; {0} when a candidate changed (the caller reads again and decides again); {2} when a
-- session is already ended at or past that end (another delivery of it wrote its outcome: nothing is written).
local n = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
--- @include "lib/position.lua"
local e = 3 + n * 3 + m * 2
for k = 3, #KEYS do
  local stored, so, no = storedAgainst(KEYS[k], ARGV[e + (k - 3) * 3 + 2])
  if stored and stored.ended == true and offsetAtOrAfter(so, no) then return {2} end
end
for i = 0, n - 1 do
  local cur = redis.call('HGET', KEYS[1], ARGV[3 + i * 3])
  if (cur or '') ~= ARGV[4 + i * 3] then return {0} end
end
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[3 + i * 3], ARGV[5 + i * 3])
end
local f = 3 + n * 3
for j = 0, m - 1 do
  redis.call('HSET', KEYS[2], ARGV[f + j * 2], ARGV[f + 1 + j * 2])
end
for k = 3, #KEYS do
  local s = e + (k - 3) * 3
  redis.call('SET', KEYS[k], ARGV[s], 'PX', ARGV[s + 1])
end
return {1}
