--[[
  snapshot: the frequent sequences of one scope with their counts, read atomically.

  KEYS[1] support hash  gram -> support
  KEYS[2] exact   hash  gram -> exact count
  KEYS[3] cost    hash  gram -> cost sum (1/10,000 cent)
  ARGV[1] minOcc  support threshold

  Returns {1, gram1, support1, exact1, cost1, gram2, ...} for every gram with support >= minOcc.
]]
local minOcc = tonumber(ARGV[1])
local out = {1}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s = tonumber(all[i + 1])
  if s >= minOcc then
    local key = all[i]
    out[#out + 1] = key
    out[#out + 1] = s
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[2], key) or '0')
    out[#out + 1] = redis.call('HGET', KEYS[3], key)
  end
end
return out
