--[[
  leaseRenew: extend a lease still held (a slow batch, before it publishes). A lease that expired is not taken
  again: another batch may have held it and written meanwhile, so what this batch read may be stale.

  KEYS[1] lease  string  holder token
  ARGV[1] token
  ARGV[2] lease TTL ms
  Returns 1 when renewed, 0 when the lease is not this token's.
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
