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
--- @include "lib/snapshot.lua"
local out = {1}
appendSnapshot(out, KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2] == '1', tonumber(ARGV[3]))
return out
