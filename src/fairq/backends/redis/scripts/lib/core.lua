-- core.lua: prepended (after lib constants) to every script. The common ARGV header and
-- helpers every operation uses. Scripts never call non-deterministic commands after a
-- write except TIME before the first write (Redis 7 replicates effects).
--
-- ARGV[1] key prefix of this broker ("fairq:" by default)
-- ARGV[2] now, in seconds since the epoch ("" = use the server's TIME)
-- ARGV[3] "1" on Redis Cluster: steps that reach another family's slot go to an outbox
-- ARGV[4...] the operation's own arguments, read with arg(i) (arg(1) is ARGV[4])
--
-- Key layout: see KEYS.md. A family is the first dot-separated word of a name; all keys of
-- a family share the hash tag {<family>}, so one script touches one slot.
local PREFIX = ARGV[1]
local NOW = tonumber(ARGV[2])
if NOW == nil then
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local CLUSTER = ARGV[3] == '1'
local function arg(i) return ARGV[3 + i] end
local function narg(i) return tonumber(ARGV[3 + i]) end
local NULL = cjson.null

local function fam_of(name) return string.match(name, '^[^.]*') end
local function fbase(fam) return PREFIX .. '{' .. fam .. '}:' end
local function fbase_of(name) return fbase(fam_of(name)) end
-- a step that writes into another family: allowed on one Redis, not on Cluster
local function same_slot(a, b) return (not CLUSTER) or fam_of(a) == fam_of(b) end

local function fail(code, ...)
  local parts = {'FQ:' .. code}
  for _, v in ipairs({...}) do parts[#parts + 1] = tostring(v) end
  return redis.error_reply(table.concat(parts, '\t'))
end

-- queues woken by this script (long polls, blocked senders), published at the end
local WOKE = {}
local WOKE_LIST = {}
local function wake(name)
  if not WOKE[name] then WOKE[name] = true; WOKE_LIST[#WOKE_LIST + 1] = name end
end
local function publish_wakes()
  if #WOKE_LIST > 0 then
    redis.call('PUBLISH', PREFIX .. 'wake', table.concat(WOKE_LIST, ' '))
  end
end

-- message ids: (milliseconds << 16 | counter) as 16 hex digits, never going backwards; a
-- stream id "ms-counter" is the same number. One counter for the prefix on one Redis (ids
-- unique everywhere); one per family on Cluster (unique within the family's slot).
local function new_ids(fb, n)
  local ms = math.floor(NOW * 1000)
  local key = CLUSTER and (fb .. 'ids') or (PREFIX .. 'ids')
  local st = redis.call('HMGET', key, 'ms', 'c')
  local lms, lc = tonumber(st[1]) or -1, tonumber(st[2]) or 0
  local cms, cc
  if ms > lms then cms, cc = ms, 0 else cms, cc = lms, lc + 1 end
  local out = {}
  for i = 1, n do
    if cc > 65535 then cms = cms + 1; cc = 0 end
    out[i] = string.format('%012x%04x', cms, cc)
    cc = cc + 1
  end
  redis.call('HSET', key, 'ms', string.format('%d', cms), 'c', cc - 1)
  return out
end
local function sid(hex)
  return string.format('%d-%d', tonumber(string.sub(hex, 1, 12), 16),
    tonumber(string.sub(hex, 13, 16), 16))
end
local function id_time(hex) return tonumber(string.sub(hex, 1, 12), 16) / 1000 end
-- the smallest id sent at or after time t (retention cut-offs compare ids as strings)
local function id_at(t) return string.format('%012x0000', math.max(0, math.floor(t * 1000))) end

-- redis.call(cmd, key, items...) in chunks (Lua's unpack is bounded); width: items per
-- element (2 for score/member or field/value pairs), so no pair is split; returns the
-- sum of integer replies
local function bulk(cmd, key, items, width)
  local step = 2000 * (width or 1)
  local total = 0
  for i = 1, #items, step do
    local got = redis.call(cmd, key, unpack(items, i, math.min(#items, i + step - 1)))
    if type(got) == 'number' then total = total + got end
  end
  return total
end

-- Redis keeps a small hash or sorted set (up to 128 entries) as a listpack, a flat list
-- each lookup and insert walks: a batch of n leases, attempts or acks on one costs O(n^2)
-- (~1 ms of a 100-message receive). Before such a batch, widen() gives the key a member
-- longer than 64 bytes, which turns it into a hash table / skiplist for good (Redis never
-- turns it back while the key lives); narrow() takes that member out again afterwards.
local WIDE = string.rep('~', 65)
local WIDE_MIN = 32
local function widen(kind, key, n)
  if n < WIDE_MIN then return false end
  local enc = redis.call('OBJECT', 'ENCODING', key)
  if enc == 'hashtable' or enc == 'skiplist' then return false end
  if kind == 'z' then redis.call('ZADD', key, '+inf', WIDE) else redis.call('HSET', key, WIDE, '') end
  return true
end
local function narrow(kind, key, widened)
  if not widened then return end
  if kind == 'z' then redis.call('ZREM', key, WIDE) else redis.call('HDEL', key, WIDE) end
end

-- HMGET / ZMSCORE over many fields, in chunks; one reply per field
local function bulk_get(cmd, key, fields)
  local out = {}
  for i = 1, #fields, 2000 do
    local got = redis.call(cmd, key, unpack(fields, i, math.min(#fields, i + 1999)))
    for _, v in ipairs(got) do out[#out + 1] = v end
    for j = #got + 1, math.min(#fields, i + 1999) - i + 1 do out[#out + 1] = false end
  end
  return out
end
