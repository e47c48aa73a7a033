--[[
  Positions of events in their topic, "<partition>:<offset>": where a session's last event stood. Included by
  saveSession-1.lua, recordRun-2.lua and writeCandidates-n.lua.
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
