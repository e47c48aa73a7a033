--[[
  leaseRelease: give a scope's lease back without writing (a batch that failed, or that took leases beyond one it
  must wait for), and withdraw the batch's waiting mark. Only the holder's token touches either key.

  KEYS[1] lease  string  holder token
  KEYS[2] want   string  token of the batch waiting longest
  ARGV[1] token
  Returns 1.
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
