--[[
  claim: take the scope's publication lock, or leave a "dirty" mark for its holder.
  Publishing is serialised per scope so that two instances never publish candidate states out of order.

  KEYS[1] lock       string  holder token, with a TTL
  KEYS[2] dirty      string  set when someone could not take the lock: the holder must publish again
  KEYS[3] published  hash    dedupe_key -> candidate JSON as last published
  ARGV[1] token
  ARGV[2] lock TTL ms

  Returns {1, k1, v1, k2, v2, ...} (lock taken, the published map) or {0} (held elsewhere; marked dirty).
]]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  local out = {1}
  local all = redis.call('HGETALL', KEYS[3])
  for i = 1, #all do out[#out + 1] = all[i] end
  return out
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {0}
