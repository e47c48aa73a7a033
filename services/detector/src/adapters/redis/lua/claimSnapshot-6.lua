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
  ARGV[1] token
  ARGV[2] lock TTL ms
  ARGV[3] minOcc  support threshold
  ARGV[4] "1" to return the window's records as well (request terms), else "0"
  ARGV[5] the number of window buckets (WINDOW_BUCKETS in apply-11.lua)

  Returns {1, P, k1, v1, ..., kP, vP, tools, n, gram1, support1, exact1, cost1, ..., gramN, ..., record1, ...}: the
  lock taken, the P published pairs, then the snapshot exactly as snapshot-3.lua returns it after its status;
  or {0} (held elsewhere; marked dirty).
]]
--- @include "lib/snapshot.lua"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return {0}
end
redis.call('DEL', KEYS[2])
local out = {1, 0}
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all do out[#out + 1] = all[i] end
out[2] = #all / 2

appendSnapshot(out, KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5]))
return out
