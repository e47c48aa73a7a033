--[[
  apply: one batch of detector events for ONE scope (all keys share the scope's hash tag).
  Mirrors services/detector/src/core/state.ts event for event (test/integration/lua-twin.int.test.ts holds
  the two equal on random operation streams).

  KEYS[1] meta     hash  cfg (parameter fingerprint), maxTs (newest ts in the scope), clock:<p> (newest ts
                         seen on partition p: its stream time)
  KEYS[2] open     zset  base name: open tasks of partition p live in KEYS[2]..":"..p, task_id -> last event ts
  KEYS[3] events   hash  task_id -> packed events of an open task: ("\30" event_id "\31" step "\31" tool "\31" cost)*
  KEYS[4] done     zset  base name: KEYS[4]..":"..p..":"..b holds partition p's completed task_id -> completion ts
                         for the task ids hashed to bucket b (of DONE_BUCKETS): small sets stay in Redis's
                         compact listpack encoding (about 25 bytes an id instead of 127 in one big sorted set);
                         remembered doneRetentionMs of p's clock
  KEYS[5] window   zset  task_id -> completion ts (ms); ties ordered by task_id bytes
  KEYS[6] records  hash  task_id -> tools joined by "\31", "\30", costs joined by ",", and when the task had a
                         user message: "\30", its terms joined by ","  (window members only)
  KEYS[7] support  hash  gram -> "<support>,<cost>": records in the window containing it, and the sum of its
                         first-occurrence cost over them (1/10,000 cent); one hash, so each gram is stored once
  KEYS[8] exact    hash  gram -> records in the window consisting of exactly it
  KEYS[9] msgs     hash  task_id -> first user message of an open task: ts "\31" event_id "\31" terms joined by ","
  KEYS[10] starts  zset  base name: KEYS[10]..":"..p holds, for each open task and window record of partition p,
                         task_id -> the offset of its first event: the smallest score is where a rebuild of this
                         scope's state on p must start replaying (see src/adapters/rebuild.ts)
  (frequency is support >= minOcc, read by snapshot-3.lua and claimSnapshot-6.lua)

  The per-partition keys are derived from declared ones and share their hash tag, so they live in the
  scope's slot. A task's events are assumed to arrive on one partition (they do: the topic is keyed by
  session_id); core/state.ts makes the same assumption.

  ARGV[1] cfg fingerprint: minLen|maxLen|minOcc|lookback|windowMs(0=off)|idleMs|doneRetentionMs|maxTaskEvents|format
  ARGV[2] epoch: the Redis epoch (shared/redis/epoch.ts) the caller verified, kept in meta; "" = no epoch check
  ARGV[3] mode: "n" normal: state of another epoch is refused ({-4}), nothing written;
                "r" rebuild: state of another epoch (written into an emptied Redis before the loss was seen)
                is deleted, then the scope is rebuilt under ARGV[2]
  ARGV[4] op count N, then N ops of 9 fields each:
          kind ("c" tool call | "d" task completed | "m" user message), task_id, event_id, ts ms, step,
          tool (for "m": the message's terms joined by ","), cost units, source partition, source offset
          ("" when unknown: offline, tests)

  Returns {1, changed (0|1), applied, ignored, completed, ignored as duplicate, as late, over the task limit,
  P, then P pairs (partition, smallest start offset of the scope's state on it, -1 when none)},
  {-2, stored cfg} when the state was built with other parameters, or {-4, stored epoch} (mode "n") when the
  scope's state belongs to another epoch.
]]
local cfg, epoch, mode = ARGV[1], ARGV[2], ARGV[3]
local DONE_BUCKETS = 128

-- The done bucket of a task id (a fixed string hash: the same id always lands in the same bucket).
local function doneKeyOf(part, task)
  local h = 0
  for i = 1, #task do h = (h * 31 + string.byte(task, i)) % 16777216 end
  return KEYS[4] .. ':' .. part .. ':' .. (h % DONE_BUCKETS)
end

-- Partitions this scope holds state on: meta keeps a clock per partition.
local scopeParts = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 6) == 'clock:' then scopeParts[string.sub(f, 7)] = true end
end

if epoch ~= '' then
  local ep = redis.call('HGET', KEYS[1], 'epoch')
  if ep ~= epoch then
    if redis.call('EXISTS', KEYS[1]) == 1 then
      if mode ~= 'r' then return {-4, ep or ''} end
      for part in pairs(scopeParts) do
        redis.call('DEL', KEYS[2] .. ':' .. part, KEYS[10] .. ':' .. part)
        for bucket = 0, DONE_BUCKETS - 1 do redis.call('DEL', KEYS[4] .. ':' .. part .. ':' .. bucket) end
      end
      redis.call('DEL', KEYS[1], KEYS[3], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
      scopeParts = {}
    end
    redis.call('HSET', KEYS[1], 'epoch', epoch)
  end
end

local stored = redis.call('HGET', KEYS[1], 'cfg')
if stored and stored ~= cfg then return {-2, stored} end
if not stored then redis.call('HSET', KEYS[1], 'cfg', cfg) end

local p = {}
for v in string.gmatch(cfg, '[^|]+') do p[#p + 1] = tonumber(v) end
local minLen, maxLen, minOcc, lookback, windowMs, idleMs, retention, maxEvents = p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]

local maxTs = tonumber(redis.call('HGET', KEYS[1], 'maxTs') or '0')
local changed, applied, ignored, completed = 0, 0, 0, 0
local dup, late, overLimit = 0, 0, 0
local clocks = {}
local US, RS = '\31', '\30'

local function int(x) return string.format('%.0f', x) end

-- Byte order (as ZSET members and core/order.ts compare); Lua's own `<` on strings follows the locale.
local function bytesLess(a, b)
  local la, lb = #a, #b
  for i = 1, math.min(la, lb) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return la < lb
end

local function split(s, sep)
  local out = {}
  if s == nil or s == '' then return out end
  local start = 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then out[#out + 1] = string.sub(s, start); break end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
  return out
end

-- Adds (d = 1) or removes (d = -1) one record's distinct grams; see core/grams.ts.
local function count(tools, costs, d)
  local n = #tools
  local prefix = {[0] = 0}
  for i = 1, n do prefix[i] = prefix[i - 1] + costs[i] end
  local seen, order = {}, {}
  local top = math.min(maxLen, n)
  for len = minLen, top do
    for i = 1, n - len + 1 do
      local key = table.concat(tools, US, i, i + len - 1)
      if seen[key] == nil then seen[key] = prefix[i + len - 1] - prefix[i - 1]; order[#order + 1] = key end
    end
  end
  local whole = nil
  if n >= minLen then
    whole = table.concat(tools, US)
    if seen[whole] == nil then seen[whole] = prefix[n]; order[#order + 1] = whole end
  end
  for _, key in ipairs(order) do
    local s, c = d, d * seen[key]
    local cur = redis.call('HGET', KEYS[7], key)
    if cur then
      local comma = string.find(cur, ',', 1, true)
      s = s + tonumber(string.sub(cur, 1, comma - 1))
      c = c + tonumber(string.sub(cur, comma + 1))
    end
    if s == 0 then redis.call('HDEL', KEYS[7], key) else redis.call('HSET', KEYS[7], key, int(s) .. ',' .. int(c)) end
  end
  if whole ~= nil then
    local x = redis.call('HINCRBY', KEYS[8], whole, d)
    if x == 0 then redis.call('HDEL', KEYS[8], whole) end
  end
end

-- A record's tools and costs; a third section (request terms) does not take part in counting.
local function unpackRecord(packed)
  local parts = split(packed, RS)
  local tools = split(parts[1], US)
  local costs = {}
  for _, c in ipairs(split(parts[2], ',')) do costs[#costs + 1] = tonumber(c) end
  return tools, costs
end

-- A task's start offset: kept while it is open and while its record is in the window (the lower one wins
-- when a forgotten task id comes back while its older record is still in the window).
local function markStart(task, part, off)
  if off == nil then return end
  local key = KEYS[10] .. ':' .. part
  local cur = redis.call('ZSCORE', key, task)
  if not cur or tonumber(cur) > off then redis.call('ZADD', key, int(off), task) end
end

local function dropStart(task)
  for part in pairs(scopeParts) do redis.call('ZREM', KEYS[10] .. ':' .. part, task) end
end

local function evictOldest()
  local oldest = redis.call('ZPOPMIN', KEYS[5])
  local task = oldest[1]
  dropStart(task)
  local packed = redis.call('HGET', KEYS[6], task)
  redis.call('HDEL', KEYS[6], task)
  if packed then
    local tools, costs = unpackRecord(packed)
    count(tools, costs, -1)
  end
end

local function complete(task, ts, openKey, part)
  local packed = redis.call('HGET', KEYS[3], task)
  redis.call('HDEL', KEYS[3], task)
  local msg = redis.call('HGET', KEYS[9], task)
  redis.call('HDEL', KEYS[9], task)
  redis.call('ZREM', openKey, task)
  redis.call('ZADD', doneKeyOf(part, task), ts, task)
  local evs = {}
  if packed then
    for _, e in ipairs(split(string.sub(packed, 2), RS)) do
      local f = split(e, US)
      evs[#evs + 1] = {id = f[1], step = tonumber(f[2]), tool = f[3], cost = tonumber(f[4])}
    end
  end
  table.sort(evs, function(a, b)
    if a.step ~= b.step then return a.step < b.step end
    return bytesLess(a.id, b.id)
  end)
  local tools, costs, costStr = {}, {}, {}
  for i, e in ipairs(evs) do tools[i] = e.tool; costs[i] = e.cost; costStr[i] = int(e.cost) end
  -- A task id seen again after it was forgotten replaces its older record (see core/state.ts).
  if redis.call('ZSCORE', KEYS[5], task) then
    local prev = redis.call('HGET', KEYS[6], task)
    redis.call('ZREM', KEYS[5], task)
    redis.call('HDEL', KEYS[6], task)
    if prev then
      local ptools, pcosts = unpackRecord(prev)
      count(ptools, pcosts, -1)
    end
  end
  redis.call('ZADD', KEYS[5], ts, task)
  local rec = table.concat(tools, US) .. RS .. table.concat(costStr, ',')
  if msg then rec = rec .. RS .. split(msg, US)[3] end
  redis.call('HSET', KEYS[6], task, rec)
  count(tools, costs, 1)
  completed = completed + 1
  changed = 1
  while redis.call('ZCARD', KEYS[5]) > lookback do evictOldest() end
end

-- Only this partition's tasks: another partition running ahead (catching up, a backlog) must not cut them.
local function sweep(openKey, part, clock)
  local due = redis.call('ZRANGEBYSCORE', openKey, '-inf', int(clock - idleMs), 'WITHSCORES')
  -- (last + idle, task) order equals (last, task) order: ZRANGEBYSCORE already returns it.
  for i = 1, #due, 2 do complete(due[i], tonumber(due[i + 1]) + idleMs, openKey, part) end
end

-- The window against the scope's newest ts; remembered task ids against their partition's clock (here in the
-- bucket the op touched; the others are trimmed when next touched, and read as core/state.ts has them).
local function expire(doneKey, clock)
  if windowMs > 0 then
    while true do
      local oldest = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
      if #oldest == 0 or tonumber(oldest[2]) > maxTs - windowMs then break end
      evictOldest()
      changed = 1
    end
  end
  redis.call('ZREMRANGEBYSCORE', doneKey, '-inf', '(' .. int(clock - retention))
end

local n = tonumber(ARGV[4])
for k = 0, n - 1 do
  local b = 5 + k * 9
  local kind, task, eid, ts = ARGV[b], ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3])
  local part = ARGV[b + 7]
  local off = tonumber(ARGV[b + 8])
  scopeParts[part] = true
  local openKey, doneKey = KEYS[2] .. ':' .. part, doneKeyOf(part, task)
  if ts > maxTs then maxTs = ts end
  if clocks[part] == nil then clocks[part] = tonumber(redis.call('HGET', KEYS[1], 'clock:' .. part) or '0') end
  -- The clock at this partition's last expiry: what core/state.ts has already forgotten by now.
  local forgotten = clocks[part] - retention
  if ts > clocks[part] then clocks[part] = ts end
  local clock = clocks[part]
  sweep(openKey, part, clock)
  local closed = redis.call('ZSCORE', doneKey, task)
  if closed and tonumber(closed) < forgotten then closed = false end
  local last = redis.call('ZSCORE', openKey, task)
  if closed then
    ignored = ignored + 1
    if ts > tonumber(closed) then late = late + 1 else dup = dup + 1 end
  elseif not last and ts + idleMs <= clock then
    -- It would open a task already idle on its partition's clock: a fragment of an older task.
    ignored = ignored + 1
    late = late + 1
  elseif kind == 'm' then
    -- The first message by (ts, event_id) wins, whatever order redeliveries bring them in.
    local cur = redis.call('HGET', KEYS[9], task)
    local take = cur == nil or cur == false
    if not take then
      local f = split(cur, US)
      local cts = tonumber(f[1])
      take = ts < cts or (ts == cts and bytesLess(eid, f[2]))
    end
    if take then redis.call('HSET', KEYS[9], task, int(ts) .. US .. eid .. US .. ARGV[b + 5]) end
    if not last then markStart(task, part, off) end
    if ts > tonumber(last or '-1') then redis.call('ZADD', openKey, ts, task) end
    applied = applied + 1
  elseif kind == 'c' then
    local packed = redis.call('HGET', KEYS[3], task) or ''
    local count_ = 0
    if packed ~= '' then count_ = select(2, string.gsub(packed, RS, '')) end
    if string.find(packed, RS .. eid .. US, 1, true) ~= nil then
      ignored = ignored + 1
      dup = dup + 1
    elseif count_ >= maxEvents then
      ignored = ignored + 1
      overLimit = overLimit + 1
    else
      redis.call('HSET', KEYS[3], task, packed .. RS .. eid .. US .. ARGV[b + 4] .. US .. ARGV[b + 5] .. US .. ARGV[b + 6])
      applied = applied + 1
    end
    if not last then markStart(task, part, off) end
    if ts > tonumber(last or '-1') then redis.call('ZADD', openKey, ts, task) end
  else
    -- A completion with no open task still makes a (possibly empty) record: it starts here.
    markStart(task, part, off)
    complete(task, ts, openKey, part)
    applied = applied + 1
  end
  expire(doneKey, clock)
end
redis.call('HSET', KEYS[1], 'maxTs', int(maxTs))
for part, c in pairs(clocks) do redis.call('HSET', KEYS[1], 'clock:' .. part, int(c)) end
local out = {1, changed, applied, ignored, completed, dup, late, overLimit, 0}
for part in pairs(scopeParts) do
  local first = redis.call('ZRANGE', KEYS[10] .. ':' .. part, 0, 0, 'WITHSCORES')
  out[#out + 1] = tonumber(part)
  out[#out + 1] = #first == 0 and -1 or tonumber(first[2])
  out[9] = out[9] + 1
end
return out
