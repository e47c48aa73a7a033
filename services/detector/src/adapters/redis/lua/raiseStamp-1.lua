--[[
  raiseStamp: after a Redis loss, a scope's publication stamp raised to the latest `detected_at` the
  flow-candidates topic holds for it (never lowered), so that a Redis whose clock is behind the lost one's
  does not stamp records flows would drop as stale (see lib/stamp.lua).

  KEYS[1] stamp  string  the scope's last publication stamp
  ARGV[1] the stamp to raise it to (ms)
  ARGV[2] the expiry of a stamp this creates (ms; DETECTOR_SCOPE_TTL_MS), "0" or absent: none. The topic keeps
          the retractions of every scope ever retired (retireFinish-15.lua lets its stamp expire): without it, each
          Redis loss would bring back a stamp for each of them, for good. A stamp that exists keeps its expiry (or
          none); a scope's next publication makes its stamp permanent again (lib/stamp.lua), and by the time one
          runs out, Redis's clock is past it.
  Returns 1.
]]
local current = redis.call('GET', KEYS[1])
if tonumber(ARGV[1]) > tonumber(current or '0') then
  local ttl = current and redis.call('PTTL', KEYS[1]) or tonumber(ARGV[2] or '0')
  if ttl > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
end
return 1
