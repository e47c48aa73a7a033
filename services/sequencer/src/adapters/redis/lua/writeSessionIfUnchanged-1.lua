-- Writes one session's state if nobody wrote it since the caller read it (compare-and-set on the version).
-- Value layout: "<version>|<json>".
-- KEYS[1] session key; ARGV[1] version the caller read ("" when absent); ARGV[2] new value; ARGV[3] TTL ms.
-- Returns {1} when written; {-1, version found} when another writer got there first (parseScriptReply maps
-- -1 to STATE_CONTENDED: the batch is retried from fresh state).
local cur = redis.call('GET', KEYS[1])
local version = ''
if cur then version = string.match(cur, '^(%d+)|') or '' end
if version ~= ARGV[1] then return {-1, version} end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1}
