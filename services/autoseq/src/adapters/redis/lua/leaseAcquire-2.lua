--[[
  leaseAcquire: take a scope's lease for one batch, unless another batch holds it or waits for it first. A batch
  that cannot take it marks that it waits (the `want` key), and the next batch of any other holder then lets
  it go first: without that, an instance that reads batch after batch could keep a hot scope to itself.

  KEYS[1] lease  string  holder token
  KEYS[2] want   string  token of the batch waiting longest
  ARGV[1] token
  ARGV[2] lease TTL ms (also the longest a waiting mark lasts: a waiter that gave up does not block for long)
  Returns 1 when the lease is this token's (taken now, or held already: then extended by the TTL), 0 when
  not (and this token now waits, unless another does; a waiting mark of its own is extended).
]]
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local want = redis.call('GET', KEYS[2])
if not holder and (not want or want == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if want then redis.call('DEL', KEYS[2]) end
  return 1
end
if not want or want == ARGV[1] then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2]) end
return 0
