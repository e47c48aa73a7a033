--[[
  retireFinish: the second step of retiring an idle scope (after retireClaim-4.lua, and after the caller has
  retracted the scope's candidates). Under the lock the claim took: when the scope is still idle, deletes all its
  state; when an apply came in meanwhile, keeps it, marks a change owed (so that it is published again; the
  `retiring` mark makes that publication send every live candidate) and releases the lock.

  KEYS[1..11]  apply-11.lua's keys, in its order (meta, open, events, done, window, records, support, exact,
               msgs, starts, tools)
  KEYS[12] lock       string  the publication lock
  KEYS[13] dirty      string  mark left by a publication that found the lock held
  KEYS[14] published  hash    dedupe_key -> candidate JSON
  KEYS[15] stamp      string  the scope's last publication stamp: kept for ARGV[2] more, so that a scope active
                              again soon after stamps its records after the retractions even if Redis's clock
                              stepped back
  ARGV[1] token
  ARGV[2] the idle time after which a scope is retired (ms)
  ARGV[3] the number of window buckets (WINDOW_BUCKETS in apply-11.lua)

  Returns {1}: retired (the caller takes the scope out of the per-partition registries); {0}: active again,
  kept and owed; {-3}: the lock was lost (its TTL ran out): nothing written, the next sweep tries again.
]]
--- @include "lib/clear.lua"
if redis.call('GET', KEYS[12]) ~= ARGV[1] then return {-3} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seen = redis.call('HGET', KEYS[1], 'seenAt')
if seen and now - tonumber(seen) < tonumber(ARGV[2]) then
  if redis.call('HINCRBY', KEYS[1], 'owed', 1) == 1 then redis.call('HSET', KEYS[1], 'owedAt', now) end
  redis.call('DEL', KEYS[12], KEYS[13])
  return {0}
end
clearState(KEYS, tonumber(ARGV[3]), partsOf(KEYS[1]))
redis.call('DEL', KEYS[12], KEYS[13], KEYS[14])
redis.call('PEXPIRE', KEYS[15], ARGV[2])
return {1}
