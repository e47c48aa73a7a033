--[[
  learnRestore: one scope's learned state copied back from the rules topic after a Redis loss, only where the
  scope has no state (no `m` field): a scope another instance already restored, or one a batch has written
  since, is newer than the copy and is left as it is.

  KEYS[1]  rules     hash    `m` and one field per context
  KEYS[2]  retiring  set     a retirement under way (scope-retire.ts): the scope was idle for its TTL; a copy
                             read before its tombstones must not bring it back
  ARGV[1]  the `m` value
  ARGV[2]  the scope's remaining idle lifetime in ms (0: none)
  ARGV[3..]  (field, value) pairs

  Returns 1 when written, 0 when the scope already had state or is being retired.
]]
if redis.call('HEXISTS', KEYS[1], 'm') == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'm', ARGV[1])
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
