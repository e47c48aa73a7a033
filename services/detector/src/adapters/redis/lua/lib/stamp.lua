-- The time a scope's publication stamps its records with (`detected_at`): Redis's clock, one clock for every
-- instance, and never below the last stamp plus 1 ms, so a scope's records are stamped in the order they are
-- published whichever instance publishes them (flows drops a record older than the one it holds as stale).
local function nextStamp(meta)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local last = tonumber(redis.call('HGET', meta, 'stamp') or '0')
  if now <= last then now = last + 1 end
  redis.call('HSET', meta, 'stamp', now)
  return now
end
