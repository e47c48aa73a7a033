-- Compare-and-set of one session's state. Value layout: "<version>|<json>".
-- KEYS[1] session key; ARGV[1] version read by the caller ("" when absent); ARGV[2] new value; ARGV[3] TTL ms.
-- Returns 1 when written, 0 when another writer got there first (the caller re-reads and re-applies).
local cur = redis.call('GET', KEYS[1])
local version = ''
if cur then version = string.match(cur, '^(%d+)|') or '' end
if version ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
