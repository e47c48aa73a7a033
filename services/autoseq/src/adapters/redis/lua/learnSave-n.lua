--[[
  learnSave: one scope's learned state and the states of its tasks, written only if the batch still holds the
  scope's lease; the lease is released in the same call. Fencing: a batch whose lease expired (a stall past
  AUTOSEQ_LEARN_LEASE_MS) or went with Redis' state writes nothing, so it can never overwrite what the next
  holder learned from a fresher read.

  KEYS[1]    lease   string  holder token
  KEYS[2]    rules   hash    `m` and one field per context
  KEYS[3..]  task keys (learned and typed task states), each written with the task TTL
  ARGV[1]    token
  ARGV[2]    task TTL ms
  ARGV[3]    scope idle TTL ms (0: the rules never expire)
  ARGV[4]    S, then S (field, value) pairs to set in rules
  then       D, then D fields to delete from rules
  then       one value per task key, in KEYS order

  Returns {1}; {-3} when the lease is not this batch's: nothing was written.
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-3} end
local i = 4
local s = tonumber(ARGV[i])
i = i + 1
for _ = 1, s do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local d = tonumber(ARGV[i])
i = i + 1
for _ = 1, d do
  redis.call('HDEL', KEYS[2], ARGV[i])
  i = i + 1
end
for k = 3, #KEYS do
  redis.call('SET', KEYS[k], ARGV[i], 'PX', ARGV[2])
  i = i + 1
end
-- Every write renews the scope's lifetime: a scope no batch has written for the idle TTL goes as a whole.
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
redis.call('DEL', KEYS[1])
return {1}
