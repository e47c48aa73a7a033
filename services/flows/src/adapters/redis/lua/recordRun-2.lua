-- Records a finished session's run in the scope's outcome memory and, in the same step, what is left of the
-- session: its end, or (when its shadow outcome is still to be written) its state marked `ran`. A session's
-- end delivered again after a failure (or to the partition's next owner) then finds the run recorded and does
-- not record it twice.
-- KEYS[1] the outcome list, KEYS[2] the session key.
-- ARGV[1] the run (JSON), ARGV[2] the list's capacity (0: no list), ARGV[3] the session's new state,
-- ARGV[4] the end event's position ("<partition>:<offset>", "" when unknown), ARGV[5] TTL ms of the state.
-- Returns {1} when recorded; {2} when the stored session shows the run recorded (`ran`) and its shadow outcome
-- still to be written (the caller goes on to write it); {0} when the stored session is at or past the end
-- (ended: nothing is left to do).
--- @include "lib/position.lua"
local stored, so, no = storedAgainst(KEYS[2], ARGV[4])
if stored then
  if stored.ran == true then return {2} end
  if offsetAtOrAfter(so, no) then return {0} end
end
local cap = tonumber(ARGV[2])
if cap > 0 then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  redis.call('LTRIM', KEYS[1], -cap, -1)
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
return {1}
