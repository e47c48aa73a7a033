-- Writes back a scope's outcome memory after a Redis loss (a rebuild), only where the list is gone: the check
-- and the push in one step, so that two instances rebuilding the same scope at once (each holds its own copy)
-- do not both find it gone and push twice, and a live instance's list written meanwhile is left as it is.
-- KEYS[1] the outcome list.
-- ARGV[1] the list's capacity (> 0); ARGV[2..] the runs (JSON), oldest first.
-- Returns {1} when written, {0} when the list was there.
if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
-- In slices: unpack of more values than Lua's C stack holds (about 8000; FLOWS_OUTCOME_CAPACITY goes to 100000)
-- fails the script.
local step = 1000
for i = 2, #ARGV, step do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + step - 1, #ARGV)))
end
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[1]), -1)
return {1}
