-- Writes a session's state copied back from the session topic after a Redis loss, unless Redis holds a later
-- version of the session (another instance restored it, or a batch wrote it since). Of two records at one
-- version the later wins, as compaction keeps it.
-- Value layout: "<version>|<json>".
-- KEYS[1] session key; ARGV[1] value; ARGV[2] TTL ms (what is left of the session's life).
-- Returns 1 when the session was not in Redis (restored), 2 when it replaced one, 0 when Redis held a later
-- version.
local cur = redis.call('GET', KEYS[1])
local created = 1
if cur then
  local have = tonumber(string.match(cur, '^(%d+)|') or '0')
  local want = tonumber(string.match(ARGV[1], '^(%d+)|') or '0')
  if have > want then return 0 end
  created = 2
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return created
