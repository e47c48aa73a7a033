--[[
  retireEpoch: ends a Redis epoch (shared/redis/epoch.ts) that the caller found unusable, here state of an older
  layout that every partition must rebuild: deleting the marker makes every instance see its state as lost and
  rebuild each partition under a new epoch. Only the epoch the caller saw: one another instance has started
  since is left alone (its rebuilds are already under way).

  KEYS[1] epoch marker  string
  ARGV[1] the epoch the caller saw
  Returns 1 when the marker was deleted, 0 when it named another epoch or none.
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
