--[[
  retireScope: an idle scope's learned state deleted, once its records in the rules topic were tombstoned, only
  while the sweep still holds the scope's lease (as learnSave is fenced): a lease that ran out may have let a
  batch in, and that batch's learning must stay.

  KEYS[1] lease  string  holder token
  KEYS[2] rules  hash    `m` and one field per context
  ARGV[1] token
  Returns 1 when deleted; -3 when the lease is not the sweep's (nothing deleted).
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -3 end
redis.call('DEL', KEYS[2])
return 1
