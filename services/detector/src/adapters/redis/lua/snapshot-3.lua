--[[
  snapshot: the frequent sequences of one scope with their counts and, when asked, the window's records,
  read atomically.

  KEYS[1] support hash  gram -> "<support>,<cost sum (1/10,000 cent)>"
  KEYS[2] exact   hash  gram -> exact count
  KEYS[3] records hash  task_id -> packed record (see apply-10.lua)
  ARGV[1] minOcc  support threshold
  ARGV[2] "1" to return the window's records as well (request terms), else "0"

  Returns {1, n, gram1, support1, exact1, cost1, ..., gramN, ..., record1, record2, ...}: the n grams with
  support >= minOcc, then (when asked) every window record as packed in KEYS[3].
]]
local minOcc = tonumber(ARGV[1])
local grams = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local v = all[i + 1]
  local comma = string.find(v, ',', 1, true)
  local s = tonumber(string.sub(v, 1, comma - 1))
  if s >= minOcc then
    local key = all[i]
    grams[#grams + 1] = key
    grams[#grams + 1] = s
    grams[#grams + 1] = tonumber(redis.call('HGET', KEYS[2], key) or '0')
    grams[#grams + 1] = string.sub(v, comma + 1)
  end
end
local out = {1, #grams / 4}
for i = 1, #grams do out[#out + 1] = grams[i] end
if ARGV[2] == '1' then
  for _, rec in ipairs(redis.call('HVALS', KEYS[3])) do out[#out + 1] = rec end
end
return out
