--[[
  release: record what was published, then release the lock unless the scope was marked dirty meanwhile.
  The scope's owed count (apply-11.lua) is cleared only when it still holds what this publication saw when it
  read its snapshot: a change applied since then stays owed, and a later batch publishes it even if the
  instance that applied it dies before publishing.

  KEYS[1] lock       string  holder token
  KEYS[2] dirty      string  mark left by claimSnapshot-8.lua
  KEYS[3] published  hash    dedupe_key -> candidate JSON
  KEYS[4] meta       hash    fields `owed` and `owedAt`; `retiring` (retireClaim-4.lua), cleared: this publication
                             sent every live candidate again (claimSnapshot-8.lua)
  ARGV[1] token
  ARGV[2] lock TTL ms
  ARGV[3] the owed count the published snapshot saw
  ARGV[4] number of upserts U, then U pairs (dedupe_key, json), then the dedupe_keys to delete

  Returns {1, again (0|1), owed}: again = 1 means the lock is still ours and the holder must publish again (owed:
  the count now, which the next snapshot sees at least); {-3} when the lock was lost (TTL expired): nothing was
  written.
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-3} end
-- Under this lock no retirement could mark the scope again: the mark this publication's claim saw is done with.
redis.call('HDEL', KEYS[4], 'retiring')
local u = tonumber(ARGV[4])
for i = 0, u - 1 do redis.call('HSET', KEYS[3], ARGV[5 + i * 2], ARGV[6 + i * 2]) end
for i = 5 + u * 2, #ARGV do redis.call('HDEL', KEYS[3], ARGV[i]) end
local owed = redis.call('HGET', KEYS[4], 'owed') or '0'
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, 1, tonumber(owed)}
end
if owed == ARGV[3] then
  redis.call('HDEL', KEYS[4], 'owed', 'owedAt')
elseif owed ~= '0' then
  -- What is left was applied after this snapshot, by instances still to publish it: owed from now.
  local now = redis.call('TIME')
  redis.call('HSET', KEYS[4], 'owedAt', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
end
redis.call('DEL', KEYS[1])
return {1, 0, 0}
