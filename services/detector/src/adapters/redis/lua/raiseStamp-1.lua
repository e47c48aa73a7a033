--[[
  raiseStamp: after a Redis loss, a scope's publication stamp raised to the latest `detected_at` the
  flow-candidates topic holds for it (never lowered), so that a Redis whose clock is behind the lost one's
  does not stamp records flows would drop as stale (see lib/stamp.lua).

  KEYS[1] stamp  string  the scope's last publication stamp
  ARGV[1] the stamp to raise it to (ms)
  Returns 1.
]]
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
