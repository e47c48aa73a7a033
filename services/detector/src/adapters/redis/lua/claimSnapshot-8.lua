--[[
  claimSnapshot: take the scope's publication lock and, in the same call, read what publishing needs: the
  published map and the scope's snapshot (one round trip instead of a claim and then a snapshot). When the
  lock is held elsewhere, leave a "dirty" mark for its holder and read nothing.
  Publishing is serialised per scope so that two instances never publish candidate states out of order.

  KEYS[1] lock       string  holder token, with a TTL
  KEYS[2] dirty      string  set when someone could not take the lock: the holder must publish again
  KEYS[3] published  hash    dedupe_key -> candidate JSON as last published
  KEYS[4] support    base name of the support buckets (as in snapshot-3.lua)
  KEYS[5] tools      string  the scope's tool dictionary (as in snapshot-3.lua)
  KEYS[6] records    base name of the window's record hashes (as in snapshot-3.lua)
  KEYS[7] meta       hash    its field `owed` counts the changes applied since the last publication released
                             (apply-11.lua); read here so that release-4.lua clears only what this one saw.
                             Its field `retiring` (retireClaim-4.lua) is read here and cleared by release-4.lua,
                             once what it asks for was sent: see below
  KEYS[8] stamp      string  the scope's last publication stamp (lib/stamp.lua)
  ARGV[1] token
  ARGV[2] lock TTL ms
  ARGV[3] minOcc  support threshold
  ARGV[4] "1" to return the window's records as well (request terms), else "0"
  ARGV[5] the number of window buckets (WINDOW_BUCKETS in apply-11.lua)
  ARGV[6] "1" to mark the scope dirty when the lock is held (a publication of a change just applied), "0" not to
          (a publication of a change found owed: the holder is publishing it, or died and its lock runs out)

  Returns {1, owed, stamp, P, k1, v1, ..., kP, vP, tools, n, gram1, support1, exact1, cost1, ..., gramN, ...,
  record1, ...}: the lock taken, the owed count it saw, the stamp its records carry, the P published pairs, then the snapshot exactly as snapshot-3.lua
  returns it after its status; or {0, ms, now} (held elsewhere; marked dirty if asked; the lock's remaining TTL
  and Redis's time, ms: a retry asks whether a change owed since then is still owed).
]]
--- @include "lib/snapshot.lua"
--- @include "lib/stamp.lua"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[6] == '1' then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end
  local now = redis.call('TIME')
  return {0, redis.call('PTTL', KEYS[1]), tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
end
redis.call('DEL', KEYS[2])
local out = {1, tonumber(redis.call('HGET', KEYS[7], 'owed') or '0'), nextStamp(KEYS[8]), 0}
local all = redis.call('HGETALL', KEYS[3])
-- A retirement that did not finish (retireClaim-4.lua) may have retracted what the map still holds: every
-- value reads as unknown ('', as restored entries are), so each live candidate is sent again. The mark stays
-- until this publication releases (release-4.lua): one that dies before sending leaves it to the next.
local resend = redis.call('HEXISTS', KEYS[7], 'retiring') == 1
for i = 1, #all do out[#out + 1] = (resend and i % 2 == 0) and '' or all[i] end
out[4] = #all / 2

appendSnapshot(out, KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5]))
return out
