--[[
  retireClaim: the first step of retiring a scope left idle for DETECTOR_SCOPE_TTL_MS (by Redis's clock since
  its last apply). Takes the scope's publication lock and marks the scope `retiring`, then returns what the
  flow-candidates topic holds for it: the caller retracts those candidates, then calls retireFinish-15.lua,
  which deletes the state only if no apply came in meanwhile.
  The `retiring` mark outlives a caller that dies between the two: the next publication of the scope
  (claimSnapshot-8.lua) then sends every live candidate again instead of only the changed ones, since flows may
  already have taken their retractions.

  KEYS[1] meta       hash    seenAt (Redis ms of the scope's last apply, apply-11.lua), retiring
  KEYS[2] lock       string  the publication lock (claimSnapshot-8.lua)
  KEYS[3] published  hash    dedupe_key -> candidate JSON as last published
  KEYS[4] stamp      string  the scope's last publication stamp (lib/stamp.lua)
  ARGV[1] token
  ARGV[2] lock TTL ms
  ARGV[3] the idle time after which a scope is retired (ms)

  Returns {1, stamp, key1, ..., keyN}: claimed, with the stamp for the retractions and the published
  dedupe_keys; {2}: no state (a registration whose apply never wrote any: the caller unregisters it); or {0}:
  not idle (or no seenAt yet: state written before the field existed, whose idle time starts now), or the lock
  held (a publication running: the next sweep tries again).
]]
--- @include "lib/stamp.lua"
if redis.call('EXISTS', KEYS[1]) == 0 then return {2} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seen = redis.call('HGET', KEYS[1], 'seenAt')
if not seen then
  redis.call('HSET', KEYS[1], 'seenAt', now)
  return {0}
end
if now - tonumber(seen) < tonumber(ARGV[3]) then return {0} end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end
redis.call('HSET', KEYS[1], 'retiring', '1')
local out = {1, nextStamp(KEYS[4])}
for _, k in ipairs(redis.call('HKEYS', KEYS[3])) do out[#out + 1] = k end
return out
