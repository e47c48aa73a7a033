--[[
  retireScope: the first step of retiring an idle scope, taken only while the sweep still holds the scope's
  lease (as learnSave is fenced): its context names go to the scope's `retiring` set, beside any an unfinished
  retirement left there, and its learned state is deleted. From here on a batch of the scope starts afresh and
  a copy finds nothing to copy; the names wait, durably, for the tombstones that the sweep (this one, or the
  next if this instance dies) sends before it deletes them.

  KEYS[1] lease     string  holder token
  KEYS[2] rules     hash    `m` and one field per context (`c:<context>`)
  KEYS[3] retiring  set     context names whose records are still to be tombstoned
  ARGV[1] token
  ARGV[2] ms the retiring set is kept at most (a backstop: the sweep deletes it once the tombstones are out)
  Returns 1 when retired; 0 when the scope had no state; -3 when the lease is not the sweep's (nothing done).
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -3 end
local fields = redis.call('HKEYS', KEYS[2])
if #fields == 0 then return 0 end
for _, f in ipairs(fields) do
  if string.sub(f, 1, 2) == 'c:' then redis.call('SADD', KEYS[3], string.sub(f, 3)) end
end
-- The scope record's own mark: a scope whose hash held only `m` still has a record to tombstone.
redis.call('SADD', KEYS[3], '')
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[2])
return 1
