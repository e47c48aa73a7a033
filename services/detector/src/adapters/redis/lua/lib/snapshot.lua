--[[
  The scope's snapshot, appended to `out`: the tool dictionary, the number n of grams with support >= minOcc,
  then the n grams as {gram (tool codes), support, exact count, cost sum}, then, when withRecords, every window
  record as packed in the record hashes. Included by snapshot-3.lua and claimSnapshot-8.lua, which return it.

  supportBase  base name: supportBase..":"..b for b < 16 (SUPPORT_BUCKETS in apply-11.lua) holds
               gram -> "<support>,<cost sum (1/10,000 cent)>[,<exact count>]"
  toolsKey     string: the scope's tool dictionary (see apply-11.lua), names joined by "\31"
  recordsBase  base name: recordsBase..":"..b for b < windowBuckets holds task_id -> packed record
]]
local function appendSnapshot(out, supportBase, toolsKey, recordsBase, minOcc, withRecords, windowBuckets)
  local grams = {}
  for b = 0, 15 do
    local all = redis.call('HGETALL', supportBase .. ':' .. b)
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
  out[#out + 1] = redis.call('GET', toolsKey) or ''
  out[#out + 1] = #grams / 4
  for i = 1, #grams do out[#out + 1] = grams[i] end
  if withRecords then
    for b = 0, windowBuckets - 1 do
      for _, rec in ipairs(redis.call('HVALS', recordsBase .. ':' .. b)) do out[#out + 1] = rec end
    end
  end
end
