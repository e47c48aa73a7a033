-- A scope's detector state, deleted: apply-11.lua's keys (`k`: its KEYS, meta first, in its order), with the
-- bucket keys derived from them. `windowBuckets`: the window's bucket count for these parameters; `parts`:
-- partition -> true, the partitions the scope holds state on (meta's clock:<p> fields).
local SUPPORT_BUCKETS = 16
-- The v3 layout kept 128 sorted-set buckets under the done keys' names: a clear covers both layouts.
local CLEAR_BUCKETS = 128
local function clearState(k, windowBuckets, parts)
  for b = 0, windowBuckets - 1 do redis.call('DEL', k[5] .. ':' .. b, k[6] .. ':' .. b) end
  for part in pairs(parts) do
    redis.call('DEL', k[2] .. ':' .. part, k[10] .. ':' .. part)
    for bucket = 0, CLEAR_BUCKETS - 1 do redis.call('DEL', k[4] .. ':' .. part .. ':' .. bucket) end
  end
  redis.call('DEL', k[1], k[3], k[5], k[6], k[7], k[8], k[9], k[11], k[11] .. ':refs')
  for bucket = 0, SUPPORT_BUCKETS - 1 do redis.call('DEL', k[7] .. ':' .. bucket) end
end

-- The partitions a scope holds state on, from its meta's clock:<p> fields.
local function partsOf(metaKey)
  local parts = {}
  for _, f in ipairs(redis.call('HKEYS', metaKey)) do
    if string.sub(f, 1, 6) == 'clock:' then parts[string.sub(f, 7)] = true end
  end
  return parts
end
