--[[
  forgetScope: the first step of an operator's forget (`POST /rules/forget`), taken only while the forget holds
  the scope's lease: the scope's forget generation goes up by one, and, as retireScope does, its context names
  go to its `retiring` set and its learned state is deleted. A copy holds the lease while it reads the scope
  with its generation, so every copy read before this step carries a lower generation than the marker the
  forget then writes to the rules topic, and every copy read after it as high a one.

  KEYS[1] lease     string  holder token
  KEYS[2] rules     hash    `m` and one field per context (`c:<context>`)
  KEYS[3] retiring  set     context names whose records are still to be tombstoned
  KEYS[4] forgets   string  the scope's forget generation (integer, no TTL)
  ARGV[1] token
  ARGV[2] ms the retiring set is kept at most (a backstop: the forget deletes it once the tombstones are out)
  Returns {1, generation} when the scope had state; {0, generation} when it had none; {-3} when the lease is
  not the forget's (nothing done).
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-3} end
local generation = redis.call('INCR', KEYS[4])
local fields = redis.call('HKEYS', KEYS[2])
if #fields == 0 then return {0, generation} end
for _, f in ipairs(fields) do
  if string.sub(f, 1, 2) == 'c:' then redis.call('SADD', KEYS[3], string.sub(f, 3)) end
end
-- The scope record's own mark: a scope whose hash held only `m` still has a record to tombstone.
redis.call('SADD', KEYS[3], '')
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[2])
return {1, generation}
