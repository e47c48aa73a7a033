--[[
  stamp: the next publication stamp of a scope (see lib/stamp.lua), for a publication's second pass under the
  lock it holds (the first pass gets its stamp from claimSnapshot-8.lua).

  KEYS[1] stamp  string  the last stamp given
  Returns the stamp (ms).
]]
--- @include "lib/stamp.lua"
return nextStamp(KEYS[1])
