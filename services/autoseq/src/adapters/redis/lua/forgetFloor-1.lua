--[[
  forgetFloor: after a Redis loss, a scope's forget generation written back from the rules topic (its forget
  marker's, or a later copy's), only where Redis holds less: a forget counts on from the highest generation the
  topic has seen, so its marker is above every copy read before it, on this Redis or the one that was lost.

  KEYS[1] forgets  string  the scope's forget generation (integer; missing: 0)
  ARGV[1] the generation the topic holds (integer >= 0; 0 only reads what Redis holds)
  Returns {1, generation} when raised to ARGV[1]; {0, generation} when Redis held as much already (another
  instance's restore wrote it first, or Redis kept a forget the topic's marker does not show): `generation` is
  what Redis holds now.
]]
local now = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local topic = tonumber(ARGV[1])
if now >= topic then return {0, now} end
redis.call('SET', KEYS[1], ARGV[1])
return {1, topic}
