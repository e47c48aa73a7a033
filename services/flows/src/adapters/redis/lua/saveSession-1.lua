-- Writes a session's state unless the stored one is further along the same partition: an instance expelled from
-- the group (a stall past the session timeout) may save after the partition's next owner did, and must not
-- put an older state back, nor drop the `ran` mark of a session whose run was recorded at the same position.
-- KEYS[1] the session key.
-- ARGV[1] the state (JSON with `at`: "<partition>:<offset>" of its last event); ARGV[2] that position ("" when
-- unknown); ARGV[3] TTL ms.
-- Returns {1} when written, {0} when the stored state is further along.
--- @include "lib/position.lua"
local stored, so, no = storedAgainst(KEYS[1], ARGV[2])
if stored then
  if offsetAfter(so, no) then return {0} end
  -- A session whose run another delivery of its end recorded (`ran`, see recordRun-2.lua) keeps that mark
  -- until a state strictly further along (its end) replaces it.
  if stored.ran == true and not offsetAfter(no, so) then return {0} end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return {1}
