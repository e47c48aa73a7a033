--[[
  unlock: gives up a publication lock whose send failed, so that a retry (this instance's, or any other's) can
  take it at once instead of waiting out its TTL. Nothing else changes: the owed count and `owedAt` stay, so the
  change is still owed, and the published map holds only what was acknowledged. A dirty mark stays for the next
  holder, who publishes the newest state anyway.

  KEYS[1] lock  string  holder token
  ARGV[1] token
  Returns 1 when the lock was this token's and is released, 0 when it was not held by it (expired, or taken).
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
