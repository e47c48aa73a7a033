--[[
  release: record what was published, then release the lock unless the scope was marked dirty meanwhile.

  KEYS[1] lock       string  holder token
  KEYS[2] dirty      string  mark left by claim-3.lua
  KEYS[3] published  hash    dedupe_key -> candidate JSON
  ARGV[1] token
  ARGV[2] lock TTL ms
  ARGV[3] number of upserts U, then U pairs (dedupe_key, json), then the dedupe_keys to delete

  Returns {1, again (0|1)}: again = 1 means the lock is still ours and the holder must publish again;
  {-3} when the lock was lost (TTL expired): nothing was written.
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-3} end
local u = tonumber(ARGV[3])
for i = 0, u - 1 do redis.call('HSET', KEYS[3], ARGV[4 + i * 2], ARGV[5 + i * 2]) end
for i = 4 + u * 2, #ARGV do redis.call('HDEL', KEYS[3], ARGV[i]) end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 1}
end
redis.call('DEL', KEYS[1])
return {1, 0}
