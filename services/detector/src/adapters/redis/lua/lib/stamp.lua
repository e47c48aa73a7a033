-- The time a scope's publication stamps its records with (`detected_at`): Redis's clock, one clock for every
-- instance, and never below the last stamp plus 1 ms, so a scope's records are stamped in the order they are
-- published whichever instance publishes them (flows drops a record older than the one it holds as stale).
-- A key of its own (not a field of `meta`): apply-11.lua takes an existing `meta` without the current epoch for
-- state of another epoch, and a publication may run on a scope with no state (restored candidates to retract).
local function nextStamp(key)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local last = tonumber(redis.call('GET', key) or '0')
  if now <= last then now = last + 1 end
  redis.call('SET', key, now)
  return now
end
