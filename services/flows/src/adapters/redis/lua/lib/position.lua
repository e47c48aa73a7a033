--[[
  Positions of events in their topic, "<partition>:<offset>": where a session's last event stood, and the stored
  session compared with one. Included by saveSession-1.lua, recordRun-2.lua and writeCandidates-n.lua.
]]
local function parsePosition(pos)
  local p, o = string.match(pos or '', '^(%d+):(%d+)$')
  return p, o
end
-- Offsets are decimal strings of up to 19 digits: compared by length, then as text (no float rounding).
local function offsetAfter(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function offsetAtOrAfter(a, b)
  return a == b or offsetAfter(a, b)
end
--[[
  The session state stored at `key`, when it can be compared with `pos` (a position on the same partition):
  the decoded state, its offset and that of `pos`. Nil otherwise (no state, unreadable, no position, another
  partition): then nothing stored stands in the way.
]]
local function storedAgainst(key, pos)
  local cur = redis.call('GET', key)
  if not cur or pos == '' then return nil end
  local ok, stored = pcall(cjson.decode, cur)
  if not ok or type(stored) ~= 'table' or type(stored.at) ~= 'string' then return nil end
  local sp, so = parsePosition(stored.at)
  local np, no = parsePosition(pos)
  if not sp or not np or sp ~= np then return nil end
  return stored, so, no
end
