--[[
  snapshot: the frequent sequences of one scope with their counts and, when asked, the window's records,
  read atomically.

  KEYS[1] support base name: KEYS[1]..":"..b for b < 16 (SUPPORT_BUCKETS in apply-11.lua) holds
                  gram -> "<support>,<cost sum (1/10,000 cent)>[,<exact count>]"; a gram is tool codes
  KEYS[2] tools   string  the scope's tool dictionary (see apply-11.lua): names joined by "\31"
  KEYS[3] records base name: KEYS[3]..":"..b for b < ARGV[3] holds task_id -> packed record (see apply-11.lua)
  ARGV[1] minOcc  support threshold
  ARGV[2] "1" to return the window's records as well (request terms), else "0"
  ARGV[3] the number of window buckets (WINDOW_BUCKETS in apply-11.lua)

  Returns {1, tools, n, gram1, support1, exact1, cost1, ..., gramN, ..., record1, record2, ...}: the tool
  dictionary, the n grams with support >= minOcc (as codes), then (when asked) every window record as packed
  in KEYS[3]. The caller decodes the codes (store.ts): Redis does no more than read.
]]
local minOcc = tonumber(ARGV[1])
local grams = {}
for b = 0, 15 do
  local all = redis.call('HGETALL', KEYS[1] .. ':' .. b)
  for i = 1, #all, 2 do
    local v = all[i + 1]
    local c1 = string.find(v, ',', 1, true)
    local s = tonumber(string.sub(v, 1, c1 - 1))
    if s >= minOcc then
      local c2 = string.find(v, ',', c1 + 1, true)
      grams[#grams + 1] = all[i]
      grams[#grams + 1] = s
      grams[#grams + 1] = c2 and tonumber(string.sub(v, c2 + 1)) or 0
      grams[#grams + 1] = c2 and string.sub(v, c1 + 1, c2 - 1) or string.sub(v, c1 + 1)
    end
  end
end
local out = {1, redis.call('GET', KEYS[2]) or '', #grams / 4}
for i = 1, #grams do out[#out + 1] = grams[i] end
if ARGV[2] == '1' then
  for b = 0, tonumber(ARGV[3]) - 1 do
    for _, rec in ipairs(redis.call('HVALS', KEYS[3] .. ':' .. b)) do out[#out + 1] = rec end
  end
end
return out
