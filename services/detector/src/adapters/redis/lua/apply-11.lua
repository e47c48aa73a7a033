--[[
  apply: one batch of detector events for ONE scope (all keys share the scope's hash tag).
  Mirrors services/detector/src/core/state.ts event for event (test/integration/lua-twin.int.test.ts holds
  the two equal on random operation streams).

  KEYS[1] meta     hash  cfg (parameter fingerprint), maxTs (newest ts in the scope), owed and owedAt (changes
                         not yet published and since when, see the end), clock:<p> (newest ts
                         seen on partition p: its stream time), seenAt (Redis time of the last call, see the
                         end), retiring (set by retireClaim-4.lua, cleared by release-4.lua)
  KEYS[2] open     zset  base name: open tasks of partition p live in KEYS[2]..":"..p, task_id -> last event ts
  KEYS[3] events   hash  task_id -> packed events of an open task: ("\30" event_id "\31" step "\31" tool "\31" cost)*
  KEYS[4] done     string base name: KEYS[4]..":"..p..":"..b holds partition p's completed task ids hashed to
                         bucket b (of DONE_BUCKETS), packed: a base ts, then ("\30" task_id "\31" the task's last own
                         ts minus the base)* in completion order (its completion ts; its last event's ts for an idle
                         close, see core/state.ts `complete`: later events are late, earlier ones duplicates); numbers in base 94 with digits '!'..'~' (a leading
                         ' ' for a negative one). Task ids hold no control characters and digits are neither
                         separator, so "\30" id "\31" finds exactly one entry. An id is remembered
                         idleMs + doneRetentionMs of p's clock after that ts (core/state.ts `expire`): an older entry is read as forgotten, and is cut when its
                         bucket is next appended to (the expired prefix; one behind a younger entry waits for
                         it). The base is the first entry's ts, moved up when the oldest live entry is 94^4 ms
                         (about 22 hours) past it, so an entry takes the id's length + 2 + 3 to 5 bytes (about
                         28 bytes an id in the v3 layout's listpack sorted sets)
  KEYS[5] window   zset  base name: the window is split over KEYS[5]..":"..b for b < WINDOW_BUCKETS (one per
                         100 records of lookback, by a hash of the task id, so that each stays in Redis's compact
                         listpack encoding under its default 128-entry limit): task_id -> completion ts (ms); the
                         window's order is (ts, task_id bytes) across them
  KEYS[6] records  hash  base name: KEYS[6]..":"..b holds the records of the task ids in window bucket b:
                         task_id -> its tools' codes (see KEYS[11]), "\30", costs joined by ",", and when the
                         task had a user message: "\30", its terms joined by "," (window members only)
  KEYS[7] support  hash  base name: KEYS[7]..":"..b (of SUPPORT_BUCKETS, by a hash of the gram) holds
                         gram -> "<support>,<cost>[,<exact>]": records in the window containing it, the sum of
                         its first-occurrence cost over them (1/10,000 cent), and (when not 0) how many consist
                         of exactly it. A gram is its tools' codes, concatenated. Small hashes of short fields
                         stay in Redis's listpack encoding (about 20 bytes a gram, against about 120 in one
                         hash of tool names joined by "\31" in layout v3)
  KEYS[8] exact    (layout v3 only: cleared with the scope; v4 keeps exact counts in support)
  KEYS[9] msgs     hash  task_id -> first user message of an open task: ts "\31" event_id "\31" terms joined by ","
  KEYS[10] starts  zset  base name: KEYS[10]..":"..p holds, for each open task and window record of partition p,
                         task_id -> the offset of its first event: the smallest score is where a rebuild of this
                         scope's state on p must start replaying (see src/adapters/rebuild.ts)
  KEYS[11] tools   string the scope's tool names joined by "\31", in order of first use: the i-th (from 0) has
                         code codeOf(i), printable ASCII ending at its only byte >= "@" (so codes concatenate
                         without separators): one byte for the first 63 tools, two for the next 2,016, and so
                         on. A name no window record uses any more leaves it at the end of the call (its slot
                         is left empty, the lowest empty slot takes the next new name): the dictionary holds the
                         names of the window's records, however many names the scope has used over time.
                         KEYS[11]..":refs" (hash: code -> how many tool positions of window records hold it)
                         says which; v4 state (without it) has it counted once from the records
  (frequency is support >= minOcc, read by snapshot-3.lua and claimSnapshot-8.lua)

  The per-partition keys are derived from declared ones and share their hash tag, so they live in the
  scope's slot. A task's events arrive on one partition (the topic is keyed by session_id); one that comes
  on another partition while its task is open is ignored as misrouted, as core/state.ts does, and a task id
  completed on one partition is not known on another.

  ARGV[1] cfg fingerprint: minLen|maxLen|minOcc|lookback|windowMs(0=off)|idleMs|doneRetentionMs|maxTaskEvents|layout
          State of the same parameters in an older layout (an earlier version wrote it) cannot be read here: it is
          refused in mode "n" ({-6}: the caller retires the epoch, so that every partition is rebuilt) and cleared
          in mode "r" (v4 state is upgraded to v5 in place instead). State of a newer layout (a newer version wrote
          it) is refused in both modes ({-7}) and left as it is.
  ARGV[2] epoch: the Redis epoch (shared/redis/epoch.ts) the caller verified, kept in meta; "" = no epoch check
  ARGV[3] mode: "n" normal: state of another epoch is refused ({-4}), nothing written;
                "r" rebuild: state of another epoch (written into an emptied Redis before the loss was seen)
                is deleted, then the scope is rebuilt under ARGV[2]
  ARGV[4] the ops, packed in one argument (one string for Redis to read instead of 9 per op): 9 fields per op,
          each followed by "\31" (no field holds a control character: ids and tool names may not, terms are
          letters): kind ("c" tool call | "d" task completed | "m" user message), task_id, event_id, ts ms,
          step, tool (for "m": the message's terms joined by ","), cost units, source partition, source offset
          ("" when unknown: offline, tests)
  ARGV[5] ms after which a change still owed is taken as abandoned (the publication lock's TTL; see the end)

  Reads and writes of the counts, open tasks' events and done buckets go through per-call caches: each key or
  field is read at most once per call and written back once at its end (fewer Redis calls per event).

  Returns {1, changed (0|1), applied, ignored, completed, ignored as duplicate, as late, over the task limit,
  as misrouted (its task open on another partition), owed (0|1: changed now, or earlier and unpublished for longer than ARGV[5], see the end), fresh (0|1: the
  scope held no state before this call, or none on one of its partitions), P, then P pairs (partition, smallest start offset of the scope's state
  on it, -1 when none)},
  {-2, stored cfg} when the state was built with other parameters, {-4, stored epoch} (mode "n") when the
  scope's state belongs to another epoch, {-6, stored cfg} (mode "n") when it is of an older layout, {-7, stored
  cfg} when it is of a newer layout.
]]
--- @include "lib/clear.lua"
local cfg, epoch, mode = ARGV[1], ARGV[2], ARGV[3]
local DONE_BUCKETS = 16
local US, RS = '\31', '\30'

-- A fixed string hash of a task id or gram (the same string always lands in the same bucket), computed once
-- per string and call: a task's events come several to a call.
local hashes = {}
local function hashOf(s)
  local h = hashes[s]
  if h == nil then
    h = 0
    for i = 1, #s do h = (h * 31 + string.byte(s, i)) % 16777216 end
    hashes[s] = h
  end
  return h
end

-- The done bucket of a task id on a partition (ids completed on one partition are not known on another: see above).
-- Each entry also caches the task's completion ts found in (or written to) its bucket (`closed`: nil until
-- read, false when none); an entry that trimExpired cuts meanwhile is one already forgotten on that
-- partition's clock, which only grows, so the cached ts is then read as forgotten too.
local doneKeys = {}
local function doneEntryOf(part, task)
  local k = doneKeys[task]
  if k == nil or k.part ~= part then
    k = {part = part, key = KEYS[4] .. ':' .. part .. ':' .. (hashOf(task) % DONE_BUCKETS)}
    doneKeys[task] = k
  end
  return k
end
local function doneKeyOf(part, task) return doneEntryOf(part, task).key end

-- Partitions this scope holds state on: meta keeps a clock per partition.
local scopeParts = partsOf(KEYS[1])

local function clearScope(buckets)
  clearState(KEYS, buckets, scopeParts)
  scopeParts = {}
end

-- One window bucket per 100 records of lookback (the fourth parameter): the same for state of these parameters.
local WINDOW_BUCKETS = math.max(1, math.ceil(tonumber(string.match(cfg, '^[^|]*|[^|]*|[^|]*|([^|]*)')) / 100))

-- The fingerprint without its last field (the layout version): the detection parameters; and that last field.
local function paramsOf(c) return string.match(c, '^(.*)|[^|]*$') or c end
local function layoutOf(c) return tonumber(string.match(c, '|v(%d+)$') or '0') end

local stored = redis.call('HGET', KEYS[1], 'cfg')
-- Same parameters, a newer layout: written by a newer version of the detector (this instance is the older one of
-- a rolling update, or a rollback). Refused in both modes, before anything is cleared: it cannot be read here,
-- and clearing it would undo the newer instances' work on every rebuild.
if stored and stored ~= cfg and paramsOf(stored) == paramsOf(cfg) and layoutOf(stored) > layoutOf(cfg) then
  return {-7, stored}
end

if epoch ~= '' then
  local ep = redis.call('HGET', KEYS[1], 'epoch')
  if ep ~= epoch then
    if redis.call('EXISTS', KEYS[1]) == 1 then
      if mode ~= 'r' then return {-4, ep or ''} end
      clearScope(WINDOW_BUCKETS)
    end
    redis.call('HSET', KEYS[1], 'epoch', epoch)
  end
end

-- Read again: the epoch check above may have cleared the scope.
stored = redis.call('HGET', KEYS[1], 'cfg')
if stored and stored ~= cfg and paramsOf(stored) == paramsOf(cfg) and string.sub(stored, -3) == '|v4'
  and string.sub(cfg, -3) == '|v5' then
  -- v4 is v5 without tools:refs: counted from the records when the dictionary is first read (see KEYS[11]). The
  -- new version stamp makes an instance still on v4 (a rolling update) rebuild this state rather than write
  -- records it would not count.
  redis.call('HSET', KEYS[1], 'cfg', cfg)
  redis.call('DEL', KEYS[11] .. ':refs')
  stored = cfg
end
if stored and stored ~= cfg then
  if paramsOf(stored) ~= paramsOf(cfg) then return {-2, stored} end
  -- Same parameters, an older layout: never misread. Refused in mode "n" ({-6}): the caller starts a new epoch,
  -- since every partition's part of every scope is of that layout, and the rebuilds clear it (mode "r").
  if mode ~= 'r' then return {-6, stored} end
  clearScope(WINDOW_BUCKETS)
  if epoch ~= '' then redis.call('HSET', KEYS[1], 'epoch', epoch) end
  stored = nil
end
-- No state here before this call (a new scope, or one retired while idle: retireFinish-15.lua), or none on one
-- of this call's partitions (see the end): the caller registers it again, whatever it remembers of having
-- registered it.
local fresh = 0
if not stored then
  redis.call('HSET', KEYS[1], 'cfg', cfg)
  fresh = 1
end
-- The partitions the scope held state on before this call: registries are per partition, and a scope retired
-- and then brought back on one partition has state again, yet none on its other partitions.
local heldParts = {}
for part in pairs(scopeParts) do heldParts[part] = true end

local p = {}
for v in string.gmatch(cfg, '[^|]+') do p[#p + 1] = tonumber(v) end
local minLen, maxLen, minOcc, lookback, windowMs, idleMs, retention, maxEvents = p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]

local maxTs = tonumber(redis.call('HGET', KEYS[1], 'maxTs') or '0')
local changed, applied, ignored, completed = 0, 0, 0, 0
local dup, late, overLimit, misrouted = 0, 0, 0, 0
local clocks = {}
-- The current op's partition: ids completed on it before this are forgotten (see the main loop).
local forgotten = 0

-- '%d' formats an integer without the float printing path '%.0f' takes (about 3x the cost, once per number
-- written); every number written here is an integer (ms, offsets, counts, cost units), '%.0f' stays for others.
local fmt, floor = string.format, math.floor
local function int(x)
  if x == floor(x) and x < 9e15 and x > -9e15 then return fmt('%d', x) end
  return fmt('%.0f', x)
end

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

-- Writes `fields` (field -> value, false = delete) to a hash, a bounded number of fields per command.
local function flushHash(key, fields)
  local set, del = {}, {}
  local function put()
    if #set > 0 then redis.call('HSET', key, unpack(set)); set = {} end
    if #del > 0 then redis.call('HDEL', key, unpack(del)); del = {} end
  end
  for f, v in pairs(fields) do
    if v == false then del[#del + 1] = f else set[#set + 1] = f; set[#set + 1] = v end
    if #set >= 512 or #del >= 256 then put() end
  end
  put()
end

-- A record's codes, one per tool, from their concatenation.
local function splitCodes(s)
  local out, from = {}, 1
  for i = 1, #s do
    if string.byte(s, i) >= 64 then out[#out + 1] = string.sub(s, from, i); from = i + 1 end
  end
  return out
end

-- The tool dictionary (KEYS[11]): names by slot, each name's code and each code's slot; and how many tool
-- positions of window records hold each code (`refs`, read and written back once per call). A tool name may
-- carry an id (a dynamic tool per document, per user): append-only, the dictionary grew without bound, and
-- every call that completes a task reads all of it.
local REFS = KEYS[11] .. ':refs'
local toolNames, toolCode, codeSlot, toolsDirty = nil, {}, {}, false
local refs, refsDirty = {}, {}
-- Empty slots, lowest first: taken by new names (freed slots join at the end of the call, not before).
local free, freeAt = {}, 1
local function codeOf(i)
  local cap, len = 63, 1
  while i >= cap do i = i - cap; cap = cap * 32; len = len + 1 end
  local last = i % 63
  i = (i - last) / 63
  local s = string.char(64 + last)
  for _ = 2, len do
    local d = i % 32
    s = string.char(32 + d) .. s
    i = (i - d) / 32
  end
  return s
end
local function loadTools()
  if toolNames then return end
  toolNames = split(redis.call('GET', KEYS[11]) or '', US)
  for i, name in ipairs(toolNames) do
    if name == '' then
      free[#free + 1] = i
    else
      local c = codeOf(i - 1)
      toolCode[name] = c
      codeSlot[c] = i
    end
  end
  local raw = redis.call('HGETALL', REFS)
  for i = 1, #raw, 2 do refs[raw[i]] = tonumber(raw[i + 1]) end
  if #raw == 0 and next(toolCode) ~= nil then
    -- A dictionary without counts (v4 state, upgraded above): counted once from the window's records (this runs
    -- before the call changes any), every name checked at the end.
    for b = 0, WINDOW_BUCKETS - 1 do
      for _, packed in ipairs(redis.call('HVALS', KEYS[6] .. ':' .. b)) do
        for _, c in ipairs(splitCodes(split(packed, RS)[1] or '')) do refs[c] = (refs[c] or 0) + 1 end
      end
    end
    for c in pairs(codeSlot) do refsDirty[c] = true end
  end
end
local function encodeTool(name)
  loadTools()
  local c = toolCode[name]
  if c == nil then
    local slot
    if freeAt <= #free then
      slot = free[freeAt]
      freeAt = freeAt + 1
    else
      slot = #toolNames + 1
    end
    toolNames[slot] = name
    c = codeOf(slot - 1)
    toolCode[name] = c
    codeSlot[c] = slot
    toolsDirty = true
  end
  return c
end
-- A record's codes entering (d = 1) or leaving (d = -1) the window.
local function reference(codes, d)
  loadTools()
  for _, c in ipairs(codes) do
    refs[c] = (refs[c] or 0) + d
    refsDirty[c] = true
  end
end

-- Support, cost and exact counts per gram: each read once per call, written back at the end.
local supS, supC, supX, supSeen, supDirty = {}, {}, {}, {}, {}
local supportKeys = {}
local function supportKeyOf(gram)
  local k = supportKeys[gram]
  if k == nil then
    k = KEYS[7] .. ':' .. (hashOf(gram) % SUPPORT_BUCKETS)
    supportKeys[gram] = k
  end
  return k
end

local function parseSupport(f, v)
  supSeen[f] = true
  local c1 = string.find(v, ',', 1, true)
  local c2 = string.find(v, ',', c1 + 1, true)
  supS[f] = tonumber(string.sub(v, 1, c1 - 1))
  if c2 then
    supC[f] = tonumber(string.sub(v, c1 + 1, c2 - 1))
    supX[f] = tonumber(string.sub(v, c2 + 1))
  else
    supC[f] = tonumber(string.sub(v, c1 + 1))
    supX[f] = 0
  end
end

-- In a call of many ops (a backlog), a support bucket is read whole (HGETALL) the first time one of its grams
-- is needed: the buckets are small (listpack-sized) and such a call touches most of them, so this is a few
-- reads per call instead of one per record and bucket. In a call of few ops (live traffic: a record or two),
-- only the record's grams are read (HMGET per bucket): parsing every gram of the scope would cost more than the
-- whole rest of the call.
local bulkSupport = true
-- Bulk reads keep each field's stored value as read; a gram's value is parsed when one of its records is
-- counted (many of a bucket's grams are not, in a given call).
local supLoaded, supRaw = {}, {}
local function loadSupport(grams)
  local wanted = nil
  for _, g in ipairs(grams) do
    if not supSeen[g] then
      local key = supportKeyOf(g)
      if bulkSupport then
        if not supLoaded[key] then
          supLoaded[key] = true
          local all = redis.call('HGETALL', key)
          for i = 1, #all, 2 do supRaw[all[i]] = all[i + 1] end
        end
        local v = supRaw[g]
        if v then
          parseSupport(g, v)
        else
          supSeen[g] = true
          supS[g], supC[g], supX[g] = 0, 0, 0
        end
      else
        wanted = wanted or {}
        local w = wanted[key]
        if w == nil then w = {}; wanted[key] = w end
        w[#w + 1] = g
      end
    end
  end
  if wanted == nil then return end
  -- A bounded number of fields per HMGET: unpack() refuses a few thousand arguments ("too many results to
  -- unpack"), and a long task (DETECTOR_MAX_LENGTH up to 100) has that many grams; the failure was fatal.
  for key, gs in pairs(wanted) do
    for from = 1, #gs, 500 do
      local to = math.min(#gs, from + 499)
      local vs = redis.call('HMGET', key, unpack(gs, from, to))
      for i = from, to do
        local g = gs[i]
        local v = vs[i - from + 1]
        if v then parseSupport(g, v)
        else
          supSeen[g] = true
          supS[g], supC[g], supX[g] = 0, 0, 0
        end
      end
    end
  end
end

-- Adds (d = 1) or removes (d = -1) one record's distinct grams; see core/grams.ts. `tools` are codes.
local function count(tools, costs, d)
  local n = #tools
  local prefix = {[0] = 0}
  for i = 1, n do prefix[i] = prefix[i - 1] + costs[i] end
  local seen, order = {}, {}
  -- By start, each gram extending the one before it (one concatenation per gram); a gram's cost is that of
  -- its first position, the smallest start (codes are self-delimiting: a gram's string is one sequence).
  for i = 1, n - minLen + 1 do
    local key = table.concat(tools, '', i, i + minLen - 2)
    for j = i + minLen - 1, math.min(n, i + maxLen - 1) do
      key = key .. tools[j]
      if seen[key] == nil then seen[key] = prefix[j] - prefix[i - 1]; order[#order + 1] = key end
    end
  end
  local whole = nil
  if n >= minLen then
    whole = table.concat(tools, '')
    if seen[whole] == nil then seen[whole] = prefix[n]; order[#order + 1] = whole end
  end
  loadSupport(order)
  for _, key in ipairs(order) do
    supS[key] = supS[key] + d
    supC[key] = supC[key] + d * seen[key]
    supDirty[key] = true
  end
  if whole ~= nil then supX[whole] = supX[whole] + d end
end

-- Open tasks' packed events: read once per call, written back at the end (false = no events / deleted).
local evs, evN, evDirty = {}, {}, {}
local function eventsOf(task)
  local e = evs[task]
  if e == nil then
    e = redis.call('HGET', KEYS[3], task) or false
    evs[task] = e
    evN[task] = e and select(2, string.gsub(e, RS, '')) or 0
  end
  return e
end

-- A task open on another partition of the scope: its calls and its message are kept per scope, not per
-- partition, so either being there while the task is not open on this partition says so.
local function openElsewhere(task)
  local e = eventsOf(task)
  if e and e ~= '' then return true end
  return redis.call('HEXISTS', KEYS[9], task) == 1
end

-- Numbers in base 94 with digits '!'..'~' (never a separator); a leading ' ' marks a negative value.
local function enc(n)
  local neg = n < 0
  if neg then n = -n end
  local s = ''
  repeat
    local d = n % 94
    s = string.char(33 + d) .. s
    n = (n - d) / 94
  until n == 0
  if neg then s = ' ' .. s end
  return s
end
local function dec(s, from, to)
  local n, neg = 0, false
  if string.byte(s, from) == 32 then neg = true; from = from + 1 end
  for k = from, to do n = n * 94 + string.byte(s, k) - 33 end
  if neg then return -n end
  return n
end

-- Done buckets (see KEYS[4]): read once per call, written back at the end. In memory a bucket is its base
-- (nil when it holds no entry) and its entries ("\30" id "\31" delta)*.
local buckets, bucketDirty = {}, {}
local function bucketOf(key)
  local b = buckets[key]
  if b == nil then
    local raw = redis.call('GET', key) or ''
    local first = string.find(raw, RS, 1, true)
    if first == nil then b = {base = nil, body = ''}
    else b = {base = dec(raw, 1, first - 1), body = string.sub(raw, first)} end
    buckets[key] = b
  end
  return b
end

-- The entry of `task` in a bucket: its start, the start of the next entry, and its ts; nil if none.
local function doneFind(b, task)
  local body = b.body
  local i, j = string.find(body, RS .. task .. US, 1, true)
  if not i then return nil end
  local e = string.find(body, RS, j + 1, true) or (#body + 1)
  return i, e, b.base + dec(body, j + 1, e - 1)
end

-- Cuts the entries expired before `limit` from the front while they are (they come in completion order),
-- and moves the base up to the oldest entry left when that is 94^4 ms past it (deltas stay short).
local function trimExpired(b, limit)
  local body, at = b.body, 1
  local firstTs = nil
  while at <= #body do
    local u = string.find(body, US, at, true)
    local e = string.find(body, RS, u + 1, true) or (#body + 1)
    firstTs = b.base + dec(body, u + 1, e - 1)
    if firstTs >= limit then break end
    at = e
  end
  if at > #body then b.base = nil; b.body = ''; return end
  if at > 1 then body = string.sub(body, at) end
  if firstTs - b.base >= 78074896 then
    local out = {}
    for id, d in string.gmatch(body, RS .. '([^' .. US .. ']*)' .. US .. '([^' .. RS .. ']*)') do
      out[#out + 1] = RS .. id .. US .. enc(b.base + dec(d, 1, #d) - firstTs)
    end
    b.base = firstTs
    body = table.concat(out)
  end
  b.body = body
end

-- A record's tools and costs; a third section (request terms) does not take part in counting.
local function unpackRecord(packed)
  local parts = split(packed, RS)
  local tools = splitCodes(parts[1] or '')
  local costs = {}
  for _, c in ipairs(split(parts[2], ',')) do costs[#costs + 1] = tonumber(c) end
  return tools, costs
end

-- A task's start offset: kept while it is open and while its record is in the window (the lower one wins
-- when a forgotten task id comes back while its older record is still in the window).
-- Evicted records' starts are removed in batches (`unstart[p]`: the task ids to remove from starts:<p>), each
-- flushed before the next start is added on p and at the end of the call: p's set is never larger at an add
-- than removing at once would leave it (so it keeps the same listpack encoding), for about one command per
-- eviction instead of one per partition. A start marked meanwhile for a pending id cancels its removal.
local unstart = {}
local function flushUnstart(part)
  local gone = unstart[part]
  if gone == nil then return end
  unstart[part] = nil
  local batch = {}
  for task in pairs(gone) do
    batch[#batch + 1] = task
    if #batch >= 256 then redis.call('ZREM', KEYS[10] .. ':' .. part, unpack(batch)); batch = {} end
  end
  if #batch > 0 then redis.call('ZREM', KEYS[10] .. ':' .. part, unpack(batch)) end
end

local function markStart(task, part, off)
  if off == nil then return end
  local key = KEYS[10] .. ':' .. part
  local cur
  local gone = unstart[part]
  if gone and gone[task] then gone[task] = nil else cur = redis.call('ZSCORE', key, task) end
  if not cur or tonumber(cur) > off then
    flushUnstart(part)
    redis.call('ZADD', key, int(off), task)
  end
end

local function dropStart(task)
  for part in pairs(scopeParts) do
    local gone = unstart[part]
    if gone == nil then gone = {}; unstart[part] = gone end
    gone[task] = true
  end
end

local function windowBucketOf(task)
  return hashOf(task) % WINDOW_BUCKETS
end

-- The window's size, and each bucket's oldest record ({task, ts}; false when empty, nil when not read yet).
local windowSize = 0
for b = 0, WINDOW_BUCKETS - 1 do windowSize = windowSize + redis.call('ZCARD', KEYS[5] .. ':' .. b) end
local heads = {}
local function before(a, b) return a.ts < b.ts or (a.ts == b.ts and bytesLess(a.task, b.task)) end
local function headOf(b)
  local h = heads[b]
  if h == nil then
    local r = redis.call('ZRANGE', KEYS[5] .. ':' .. b, 0, 0, 'WITHSCORES')
    if #r == 0 then h = false else h = {task = r[1], ts = tonumber(r[2])} end
    heads[b] = h
  end
  return h
end
-- The non-empty buckets in a binary min-heap by their heads (built at the first eviction of a call, then kept up
-- to date): an eviction costs O(log buckets) instead of a scan of every bucket's head, which made each evicted
-- record cost time linear in DETECTOR_LOOKBACK (a bucket per 100 records).
local heap, heapAt = nil, {}
local function heapSwap(i, j)
  heap[i], heap[j] = heap[j], heap[i]
  heapAt[heap[i]] = i
  heapAt[heap[j]] = j
end
local function heapUp(i)
  while i > 1 do
    local up = math.floor(i / 2)
    if not before(heads[heap[i]], heads[heap[up]]) then return end
    heapSwap(i, up)
    i = up
  end
end
local function heapDown(i)
  local n = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and before(heads[heap[l]], heads[heap[m]]) then m = l end
    if r <= n and before(heads[heap[r]], heads[heap[m]]) then m = r end
    if m == i then return end
    heapSwap(i, m)
    i = m
  end
end
-- Bucket b's head changed (or may have): its place in the heap, once there is one.
local function heapFix(b)
  if heap == nil then return end
  local h, i = headOf(b), heapAt[b]
  if h and i then
    heapUp(i)
    heapDown(heapAt[b])
  elseif h then
    heap[#heap + 1] = b
    heapAt[b] = #heap
    heapUp(#heap)
  elseif i then
    local last = #heap
    heapSwap(i, last)
    heap[last] = nil
    heapAt[b] = nil
    if i < last then
      local moved = heap[i]
      heapUp(i)
      heapDown(heapAt[moved])
    end
  end
end
-- The window's oldest record by (ts, task_id bytes): its bucket and {task, ts}; nil when the window is empty.
local function oldestRecord()
  if heap == nil then
    heap = {}
    for b = 0, WINDOW_BUCKETS - 1 do
      if headOf(b) then
        heap[#heap + 1] = b
        heapAt[b] = #heap
        heapUp(#heap)
      end
    end
  end
  local b = heap[1]
  if b == nil then return nil, nil end
  return b, heads[b]
end
local function windowRemove(b, task)
  redis.call('ZREM', KEYS[5] .. ':' .. b, task)
  windowSize = windowSize - 1
  local h = heads[b]
  if h and h.task == task then
    heads[b] = nil
    heapFix(b)
  end
end
local function windowAdd(b, task, ts)
  redis.call('ZADD', KEYS[5] .. ':' .. b, int(ts), task)
  windowSize = windowSize + 1
  local h, new = heads[b], {task = task, ts = ts}
  if h == false or (h and before(new, h)) then
    heads[b] = new
    heapFix(b)
  end
end

-- Takes a record out of window bucket b and its sequences out of the counts.
local function dropRecord(b, task)
  windowRemove(b, task)
  local recordsKey = KEYS[6] .. ':' .. b
  local packed = redis.call('HGET', recordsKey, task)
  if packed then
    -- Counted (when an older version's state is first read here) before the record leaves.
    loadTools()
    redis.call('HDEL', recordsKey, task)
    local tools, costs = unpackRecord(packed)
    count(tools, costs, -1)
    reference(tools, -1)
  end
end

local function evictOldest()
  local b, oldest = oldestRecord()
  dropRecord(b, oldest.task)
  -- A task of the same id may be open again (its id forgotten after doneRetentionMs, a recurring task's fixed id):
  -- its start shares the entry, which must stay until that task's own record leaves, or the checkpoint passes
  -- its first events and a rebuild makes a fragment of it.
  if not openElsewhere(oldest.task) then dropStart(oldest.task) end
end

-- Open tasks' last ts per partition (KEYS[2]..":"..p): each task's score read once per call, writes kept
-- here and flushed before the sorted set is read by range (a sweep) and at the end (fewer Redis calls per
-- event). `due[p]`: a lower bound on (smallest last ts + idleMs) over p's open tasks, nil when unknown: no
-- task of p is idle before p's clock reaches it, so the sweep's range read is skipped until then.
local openLast, openDirty, due = {}, {}, {}
local function lastOf(part, task)
  local t = openLast[part]
  if t == nil then t = {}; openLast[part] = t; openDirty[part] = {} end
  local v = t[task]
  if v == nil then
    v = redis.call('ZSCORE', KEYS[2] .. ':' .. part, task)
    v = v and tonumber(v) or false
    t[task] = v
  end
  return v
end
-- ts = false: the task is no longer open.
local function setLast(part, task, ts)
  lastOf(part, task)
  openLast[part][task] = ts
  openDirty[part][task] = true
  if ts and due[part] and ts + idleMs < due[part] then due[part] = ts + idleMs end
end
local function flushOpen(part)
  local dirty = openDirty[part]
  if dirty == nil or next(dirty) == nil then return end
  local key, t = KEYS[2] .. ':' .. part, openLast[part]
  local add, rem = {}, {}
  local function put()
    if #add > 0 then redis.call('ZADD', key, unpack(add)); add = {} end
    if #rem > 0 then redis.call('ZREM', key, unpack(rem)); rem = {} end
  end
  for task in pairs(dirty) do
    local v = t[task]
    if v then add[#add + 1] = int(v); add[#add + 1] = task else rem[#rem + 1] = task end
    if #add >= 512 or #rem >= 256 then put() end
  end
  put()
  openDirty[part] = {}
end

-- One packed event of an open task (see KEYS[3]): event_id, step, tool, cost units.
local EVENT = RS .. '([^' .. US .. ']*)' .. US .. '([^' .. US .. ']*)' .. US .. '([^' .. US .. ']*)' .. US .. '([^' .. RS .. ']*)'
local function stepOrder(a, b)
  if a.step ~= b.step then return a.step < b.step end
  return bytesLess(a.id, b.id)
end

-- `own`: the newest ts still the task's own (a redelivery when it comes again, later ones are late): `ts` for
-- a task_completed, the task's last event's ts for an idle close (core/state.ts `complete`).
local function complete(task, ts, openKey, part, own)
  own = own or ts
  local packed = eventsOf(task)
  evs[task] = false
  evN[task] = 0
  evDirty[task] = true
  local msg = redis.call('HGET', KEYS[9], task)
  if msg then redis.call('HDEL', KEYS[9], task) end
  setLast(part, task, false)
  -- Remember the id: an older entry of the same id is one already forgotten (a live one would have made
  -- this task's events ignored); expired entries at the front go.
  local doneKey = doneKeyOf(part, task)
  local b = bucketOf(doneKey)
  local i, e = doneFind(b, task)
  if i then b.body = string.sub(b.body, 1, i - 1) .. string.sub(b.body, e) end
  trimExpired(b, forgotten)
  if b.base == nil then b.base = own end
  b.body = b.body .. RS .. task .. US .. enc(own - b.base)
  bucketDirty[doneKey] = true
  doneEntryOf(part, task).closed = own
  local list = {}
  if packed then
    for id, step, tool, cost in string.gmatch(packed, EVENT) do
      list[#list + 1] = {id = id, step = tonumber(step), tool = tool, cost = tonumber(cost)}
    end
  end
  table.sort(list, stepOrder)
  local tools, costs, costStr = {}, {}, {}
  for k, ev in ipairs(list) do tools[k] = encodeTool(ev.tool); costs[k] = ev.cost; costStr[k] = int(ev.cost) end
  -- A task id seen again after it was forgotten replaces its older record (see core/state.ts).
  local wb = windowBucketOf(task)
  local recordsKey = KEYS[6] .. ':' .. wb
  if redis.call('ZSCORE', KEYS[5] .. ':' .. wb, task) then dropRecord(wb, task) end
  windowAdd(wb, task, ts)
  local rec = table.concat(tools, '') .. RS .. table.concat(costStr, ',')
  if msg then rec = rec .. RS .. split(msg, US)[3] end
  redis.call('HSET', recordsKey, task, rec)
  count(tools, costs, 1)
  reference(tools, 1)
  completed = completed + 1
  changed = 1
  while windowSize > lookback do evictOldest() end
end

-- Only this partition's tasks: another partition running ahead (catching up, a backlog) must not cut them.
local function sweep(openKey, part, clock)
  if due[part] == nil then
    flushOpen(part)
    local first = redis.call('ZRANGE', openKey, 0, 0, 'WITHSCORES')
    due[part] = #first == 0 and math.huge or tonumber(first[2]) + idleMs
  end
  if clock < due[part] then return end
  flushOpen(part)
  local idle = redis.call('ZRANGEBYSCORE', openKey, '-inf', int(clock - idleMs), 'WITHSCORES')
  -- (last + idle, task) order equals (last, task) order: ZRANGEBYSCORE already returns it.
  for i = 1, #idle, 2 do
    local last = tonumber(idle[i + 1])
    complete(idle[i], last + idleMs, openKey, part, last)
  end
  due[part] = nil
end

-- The window against the scope's newest ts. (Remembered task ids expire by reading: see KEYS[4].)
local function expire()
  if windowMs > 0 then
    while true do
      local _, oldest = oldestRecord()
      if oldest == nil or oldest.ts > maxTs - windowMs then break end
      evictOldest()
      changed = 1
    end
  end
end

-- Each partition's clock at its last sweep in this call: a sweep is needed only when the clock moved (a
-- task's last ts only grows, and a task cannot open already due).
local swept = {}
local F = {}
for f in string.gmatch(ARGV[4], '([^' .. US .. ']*)' .. US) do F[#F + 1] = f end
bulkSupport = #F >= 9 * 64
for k = 0, #F / 9 - 1 do
  local b = 1 + k * 9
  local kind, task, eid, ts = F[b], F[b + 1], F[b + 2], tonumber(F[b + 3])
  local part = F[b + 7]
  local off = tonumber(F[b + 8])
  scopeParts[part] = true
  local openKey = KEYS[2] .. ':' .. part
  if ts > maxTs then maxTs = ts end
  if clocks[part] == nil then clocks[part] = tonumber(redis.call('HGET', KEYS[1], 'clock:' .. part) or '0') end
  -- The clock at this partition's last expiry: what core/state.ts has already forgotten by now (an entry holds a
  -- last own ts, remembered idleMs + retention after it: see KEYS[4]).
  forgotten = clocks[part] - retention - idleMs
  if ts > clocks[part] then clocks[part] = ts end
  local clock = clocks[part]
  if swept[part] ~= clock then
    sweep(openKey, part, clock)
    swept[part] = clock
  end
  local d = doneEntryOf(part, task)
  if d.closed == nil then
    local _, _, c = doneFind(bucketOf(d.key), task)
    d.closed = c or false
  end
  local closed = d.closed
  if closed and closed < forgotten then closed = nil end
  local last = lastOf(part, task)
  if closed then
    ignored = ignored + 1
    if ts > closed then late = late + 1 else dup = dup + 1 end
  elseif not last and openElsewhere(task) then
    -- Its task is open on another partition: that partition's (core/state.ts, `misrouted`).
    ignored = ignored + 1
    misrouted = misrouted + 1
  elseif not last and ts + idleMs <= clock then
    -- It would open a task already idle on its partition's clock: a fragment of an older task.
    ignored = ignored + 1
    late = late + 1
  elseif kind == 'm' then
    -- The first message by (ts, event_id) wins, whatever order redeliveries bring them in.
    local cur = redis.call('HGET', KEYS[9], task)
    local take = cur == nil or cur == false
    local again = false
    if not take then
      local f = split(cur, US)
      local cts = tonumber(f[1])
      -- The message kept, delivered again: a duplicate, as a call already in its task is (core/state.ts).
      again = f[2] == eid
      take = ts < cts or (ts == cts and bytesLess(eid, f[2]))
    end
    if take then redis.call('HSET', KEYS[9], task, int(ts) .. US .. eid .. US .. F[b + 5]) end
    if not last then markStart(task, part, off) end
    if ts > (last or -1) then setLast(part, task, ts) end
    if again then
      ignored = ignored + 1
      dup = dup + 1
    else
      applied = applied + 1
    end
  elseif kind == 'c' then
    local packed = eventsOf(task) or ''
    if string.find(packed, RS .. eid .. US, 1, true) ~= nil then
      ignored = ignored + 1
      dup = dup + 1
    elseif evN[task] >= maxEvents then
      ignored = ignored + 1
      overLimit = overLimit + 1
    else
      evs[task] = packed .. RS .. eid .. US .. F[b + 4] .. US .. F[b + 5] .. US .. F[b + 6]
      evN[task] = evN[task] + 1
      evDirty[task] = true
      applied = applied + 1
    end
    if not last then markStart(task, part, off) end
    if ts > (last or -1) then setLast(part, task, ts) end
  else
    -- A completion with no open task still makes a (possibly empty) record: it starts here.
    markStart(task, part, off)
    complete(task, ts, openKey, part)
    applied = applied + 1
  end
  expire()
end

-- Write back what the caches changed.
for part in pairs(openDirty) do flushOpen(part) end
local supOut, evOut = {}, {}
for g in pairs(supDirty) do
  local key = supportKeyOf(g)
  supOut[key] = supOut[key] or {}
  if supS[g] == 0 then
    supOut[key][g] = false
  elseif supX[g] == 0 then
    supOut[key][g] = int(supS[g]) .. ',' .. int(supC[g])
  else
    supOut[key][g] = int(supS[g]) .. ',' .. int(supC[g]) .. ',' .. int(supX[g])
  end
end
for key, fields in pairs(supOut) do flushHash(key, fields) end
for task in pairs(evDirty) do evOut[task] = evs[task] end
flushHash(KEYS[3], evOut)
if toolNames then
  local out = {}
  for c in pairs(refsDirty) do
    local n = refs[c] or 0
    if n > 0 then
      out[c] = int(n)
    else
      out[c] = false
      local slot = codeSlot[c]
      if slot and toolNames[slot] ~= '' then
        toolCode[toolNames[slot]] = nil
        toolNames[slot] = ''
        toolsDirty = true
      end
    end
  end
  flushHash(REFS, out)
end
if toolsDirty then
  while #toolNames > 0 and toolNames[#toolNames] == '' do toolNames[#toolNames] = nil end
  if #toolNames == 0 then redis.call('DEL', KEYS[11]) else redis.call('SET', KEYS[11], table.concat(toolNames, US)) end
end
for key in pairs(bucketDirty) do
  local b = buckets[key]
  if b.body == '' then redis.call('DEL', key) else redis.call('SET', key, enc(b.base) .. b.body) end
end

-- Redis's clock, read once per call: `seenAt` is when the scope was last applied to (an idle scope is retired
-- after DETECTOR_SCOPE_TTL_MS, retireClaim-4.lua), written by every call, ops or not (a rebuild's touch keeps
-- the scope too); the owed marks below use the same reading.
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local metaFields = {'maxTs', int(maxTs), 'seenAt', int(now)}
for part, c in pairs(clocks) do
  metaFields[#metaFields + 1] = 'clock:' .. part
  metaFields[#metaFields + 1] = int(c)
  if not heldParts[part] then fresh = 1 end
end
redis.call('HSET', KEYS[1], unpack(metaFields))
for part in pairs(unstart) do flushUnstart(part) end
-- A change is owed to the flow-candidates topic until a publication that saw it releases (release-4.lua):
-- `owed` counts the changes, `owedAt` (Redis time, ms) is when the oldest one still owed was applied. A batch
-- that finds a change owed for longer than a publication may take (ARGV[5], the lock's TTL) publishes it: its
-- instance died between its apply and its publication (its batch, redelivered, is all duplicates).
if changed == 1 and redis.call('HINCRBY', KEYS[1], 'owed', 1) == 1 then
  redis.call('HSET', KEYS[1], 'owedAt', now)
end
local owed = changed
if owed == 0 then
  local at = redis.call('HGET', KEYS[1], 'owedAt')
  if at and now - tonumber(at) >= tonumber(ARGV[5]) then owed = 1 end
end
local out = {1, changed, applied, ignored, completed, dup, late, overLimit, misrouted, owed, fresh, 0}
for part in pairs(scopeParts) do
  local first = redis.call('ZRANGE', KEYS[10] .. ':' .. part, 0, 0, 'WITHSCORES')
  out[#out + 1] = tonumber(part)
  out[#out + 1] = #first == 0 and -1 or tonumber(first[2])
  out[12] = out[12] + 1
end
return out
