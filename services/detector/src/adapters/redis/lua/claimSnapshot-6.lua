--[[
  claimSnapshot: take the scope's publication lock and, in the same call, read what publishing needs: the
  published map and the scope's snapshot (one round trip instead of a claim and then a snapshot). When the
  lock is held elsewhere, leave a "dirty" mark for its holder and read nothing.
  Publishing is serialised per scope so that two instances never publish candidate states out of order.

  KEYS[1] lock       string  holder token, with a TTL
  KEYS[2] dirty      string  set when someone could not take the lock: the holder must publish again
  KEYS[3] published  hash    dedupe_key -> candidate JSON as last published
  KEYS[4] support    hash    gram -> "<support>,<cost sum>"   (as in snapshot-3.lua)
  KEYS[5] exact      hash    gram -> exact count
  KEYS[6] records    hash    task_id -> packed record (see apply-10.lua)
  ARGV[1] token
  ARGV[2] lock TTL ms
  ARGV[3] minOcc  support threshold
  ARGV[4] "1" to return the window's records as well (request terms), else "0"

  Returns {1, P, k1, v1, ..., kP, vP, n, gram1, support1, exact1, cost1, ..., gramN, ..., record1, ...}: the
  lock taken, the P published pairs, then the snapshot exactly as snapshot-3.lua returns it after its status;
  or {0} (held elsewhere; marked dirty).
]]
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return {0}
end
redis.call('DEL', KEYS[2])
local out = {1, 0}
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all do out[#out + 1] = all[i] end
out[2] = #all / 2

local minOcc = tonumber(ARGV[3])
local grams = {}
local support = redis.call('HGETALL', KEYS[4])
for i = 1, #support, 2 do
  local v = support[i + 1]
  local comma = string.find(v, ',', 1, true)
  local s = tonumber(string.sub(v, 1, comma - 1))
  if s >= minOcc then
    local key = support[i]
    grams[#grams + 1] = key
    grams[#grams + 1] = s
    grams[#grams + 1] = tonumber(redis.call('HGET', KEYS[5], key) or '0')
    grams[#grams + 1] = string.sub(v, comma + 1)
  end
end
out[#out + 1] = #grams / 4
for i = 1, #grams do out[#out + 1] = grams[i] end
if ARGV[4] == '1' then
  for _, rec in ipairs(redis.call('HVALS', KEYS[6])) do out[#out + 1] = rec end
end
return out
