-- room.lua: the waiting-room rules of backends/room_policy.py (SPEC §8), line for line in
-- Lua, so that every waiting-room step is one script on the room's slot. The Python module
-- is the reference: a change there is made here too (the conformance suite and
-- tests/redis_backend/test_rooms_lua.py compare the two).
--
-- A room's keys share the hash tag {r:<room>} (see KEYS.md): `row` (hash: the RoomRow
-- fields), `fans` (hash fan -> seq), `steps` (zset: the cursor after each admission step),
-- `stepv` (hash upto -> "admitted_at expires_at"), `used` (zset seq -> place).
--
-- One thing stays in the client: the pre-queue's permutation (fairq/draw.py, BLAKE2b in a
-- Feistel network: 64-bit arithmetic Redis's Lua does not have). It is a pure function of
-- the seed and the pre-queue's size, both frozen when the room is drawn, so a step that
-- needs the place of a pre-queue fan takes it as an argument together with the seed and
-- size it was computed from (a "hint"); if they are not the room's, the step changes
-- nothing and answers {"NEEDPLACE", seed, size} and the client computes and asks again.
-- The draw's seed itself comes from the client's CSPRNG with every step that may draw.

local ROOM_RATE_WINDOW = 10.0
local ROOM_MAX_CREDIT_SECONDS = 1.0
local ROOM_NUM = {rate = 1, created_at = 1, joined = 1, drawn_at = 1, pre_queue = 1, head = 1,
  expired_upto = 1, used = 1, used_live = 1, credit = 1, credit_at = 1, meas_sum = 1,
  meas_at = 1, meas_since = 1, admitter_until = 1, fence = 1, sold_out_at = 1,
  told_sold_out = 1, closed_at = 1}
local ROOM_INT = {joined = 1, pre_queue = 1, head = 1, expired_upto = 1, used = 1,
  used_live = 1, fence = 1, told_sold_out = 1}
local ROOM_ZERO = {'joined', 'pre_queue', 'head', 'expired_upto', 'used', 'used_live', 'fence',
  'told_sold_out', 'credit', 'meas_sum', 'admitter_until'}

-- a float as text that reads back as the same double (tostring keeps 14 digits only)
local function f17(x) return string.format('%.17g', x) end
local function opt17(x) if x == nil then return '' end return f17(x) end

local function room_base(key) return string.sub(key, 1, -4) end

-- the row as a table (numbers decoded, absent optional fields nil), or nil
local function room_load(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return nil end
  local r = {_key = key, _dirty = {}, _base = room_base(key)}
  for i = 1, #flat, 2 do
    local f, v = flat[i], flat[i + 1]
    if ROOM_NUM[f] then v = tonumber(v) end
    r[f] = v
  end
  for _, f in ipairs(ROOM_ZERO) do if r[f] == nil then r[f] = 0 end end
  local cfg = cjson.decode(r.config)
  if cfg.opens_at == NULL then cfg.opens_at = nil end
  if cfg.max_active == NULL then cfg.max_active = nil end
  r.cfg = cfg
  return r
end

local function rset(r, f, v) r[f] = v; r._dirty[f] = true end

-- write the fields the rules changed (nil: removed)
local function room_save(r)
  local sets, dels = {}, {}
  for f in pairs(r._dirty) do
    local v = r[f]
    if v == nil then dels[#dels + 1] = f
    elseif ROOM_INT[f] then sets[#sets + 1] = f; sets[#sets + 1] = string.format('%d', v)
    elseif ROOM_NUM[f] then sets[#sets + 1] = f; sets[#sets + 1] = f17(v)
    else sets[#sets + 1] = f; sets[#sets + 1] = v end
  end
  if #sets > 0 then redis.call('HSET', r._key, unpack(sets)) end
  if #dels > 0 then redis.call('HDEL', r._key, unpack(dels)) end
  r._dirty = {}
end

-- the row as field/value pairs (what the client decodes with _decode_row)
local function room_flat(r) return redis.call('HGETALL', r._key) end

local function room_phase(r)
  if r.closed_at then return 'closed' end
  if r.sold_out_at then return 'sold_out' end
  if not r.drawn_at then return 'scheduled' end
  return 'open'
end

-- rule 3: at the first operation once open, freeze the pre-queue and keep the seed
local function room_draw_if_due(r, seed)
  if r.drawn_at then return false end
  local opens_at = r.cfg.opens_at
  if opens_at ~= nil and NOW < opens_at then return false end
  if r.joined > 1 and (seed == nil or #seed ~= 32) then error('FQ:BADSEED') end
  rset(r, 'drawn_at', NOW)
  rset(r, 'pre_queue', r.joined)
  if r.joined > 1 then rset(r, 'draw_seed', seed) else rset(r, 'draw_seed', nil) end
  rset(r, 'credit', 0.0)
  rset(r, 'credit_at', NOW)
  return true
end

-- the place of arrival seq, or nil when it is a drawn pre-queue fan and hint (seed, size,
-- place) is not for this room's draw
local function room_place_of(r, seq, hint)
  if seq <= r.pre_queue and r.draw_seed ~= nil then
    if hint and hint.seed == r.draw_seed and hint.size == r.pre_queue then return hint.place end
    return nil
  end
  return seq
end

local function room_waiting(r)
  if not r.drawn_at or r.sold_out_at or r.closed_at then return 0 end
  return r.joined - r.head
end

local function room_decayed(r)
  if not r.meas_at then return 0.0 end
  return r.meas_sum * math.exp(-math.max(0.0, NOW - r.meas_at) / ROOM_RATE_WINDOW)
end

local function expm1(x)
  if math.abs(x) < 1e-5 then return x + x * x / 2 + x * x * x / 6 end
  return math.exp(x) - 1
end

local function room_measured_rate(r)
  if not r.meas_since then return 0.0 end
  local span = math.max(NOW - r.meas_since, 1e-3)
  return room_decayed(r) / (ROOM_RATE_WINDOW * -expm1(-span / ROOM_RATE_WINDOW))
end

local function room_eta_rate(r)
  local m = room_measured_rate(r)
  if m > 1e-6 then return m end
  return r.rate
end

-- move the cursor past n more fans, count them in the measured rate, and record the step
local function room_note_admitted(r, n)
  if n <= 0 then return end
  if not r.meas_since then
    local lead = 0.0
    if r.rate > 0 then lead = math.min(1.0, n / r.rate) end
    rset(r, 'meas_since', NOW - lead)
  end
  rset(r, 'meas_sum', room_decayed(r) + n)
  rset(r, 'meas_at', NOW)
  rset(r, 'head', r.head + n)
  local upto = string.format('%d', r.head)
  redis.call('ZADD', r._base .. 'steps', r.head, upto)
  redis.call('HSET', r._base .. 'stepv', upto, f17(NOW) .. ' ' .. f17(NOW + r.cfg.token_ttl))
end

local function room_active(r) return r.head - r.expired_upto - r.used_live end

-- advance expired_upto over the admission steps whose tokens have all lapsed
local function room_expire(r)
  if r.expired_upto >= r.head then return end
  local upto = r.expired_upto
  local cursor = upto
  local done = false
  while not done do
    local got = redis.call('ZRANGEBYSCORE', r._base .. 'steps', '(' .. cursor, '+inf',
      'LIMIT', 0, 256)
    if #got == 0 then break end
    local vals = redis.call('HMGET', r._base .. 'stepv', unpack(got))
    for i, step in ipairs(got) do
      local expires_at = tonumber(string.match(vals[i], ' (.*)$'))
      if expires_at > NOW then done = true; break end
      upto = tonumber(step)
    end
    if #got < 256 then break end
    cursor = got[#got]
  end
  if upto > r.expired_upto then
    local lapsed = redis.call('ZCOUNT', r._base .. 'used', '(' .. r.expired_upto, upto)
    rset(r, 'used_live', r.used_live - lapsed)
    rset(r, 'expired_upto', upto)
  end
end

-- take or renew the admitter lease; a new holder gets the next fence and no credit
local function room_take_admitter(r, holder, lease)
  if r.admitter ~= nil and r.admitter ~= holder and r.admitter_until > NOW then return false end
  if r.admitter ~= holder then
    rset(r, 'admitter', holder)
    rset(r, 'fence', r.fence + 1)
    rset(r, 'credit', 0.0)
    rset(r, 'credit_at', NOW)
  end
  rset(r, 'admitter_until', NOW + lease)
  return true
end

local function room_release_admitter(r, holder)
  if r.admitter ~= holder then return false end
  rset(r, 'admitter', nil)
  rset(r, 'admitter_until', 0.0)
  return true
end

-- how many fans this step lets in: the credit earned at `rate` since the last step (at
-- most a second's worth), bounded by who waits and by max_active; unused credit not banked
local function room_allowance(r)
  if room_phase(r) ~= 'open' then
    rset(r, 'credit', 0.0)
    rset(r, 'credit_at', NOW)
    return 0
  end
  local last = r.credit_at or NOW
  local cap = math.max(1.0, r.rate * ROOM_MAX_CREDIT_SECONDS)
  local credit = math.min(cap, r.credit + r.rate * math.max(0.0, NOW - last))
  rset(r, 'credit_at', NOW)
  local due = math.floor(credit + 1e-9)  -- 24.999999999 of float sums is 25
  local allowed = math.min(due, room_waiting(r))
  if r.cfg.max_active ~= nil then
    allowed = math.min(allowed, math.max(0, r.cfg.max_active - room_active(r)))
  end
  credit = math.max(0.0, credit - allowed)
  if allowed < due then credit = math.min(credit, 1.0) end
  rset(r, 'credit', credit)
  return allowed
end

-- {fence|"", admitted, rate, phase, waiting, holder_until|""}
local function room_tick_result(r, held, admitted)
  local fence, until_ = '', ''
  if held then fence = string.format('%d', r.fence) else until_ = f17(r.admitter_until) end
  return {fence, admitted, f17(r.rate), room_phase(r), room_waiting(r), until_}
end

-- (admitted_at, expires_at) of the admission step that let place p in
local function room_step_of(r, p)
  local got = redis.call('ZRANGEBYSCORE', r._base .. 'steps', p, '+inf', 'LIMIT', 0, 1)
  if not got[1] then error('FQ:NOSTEP\t' .. p) end
  local v = redis.call('HGET', r._base .. 'stepv', got[1])
  local at, exp = string.match(v, '^(%S+) (%S+)$')
  return tonumber(at), tonumber(exp)
end

local function room_is_used(r, seq)
  return redis.call('ZSCORE', r._base .. 'used', seq) ~= false
end

local function room_needplace(r) return {'NEEDPLACE', r.draw_seed, r.pre_queue} end

-- where arrival seq stands: {state, seq, position, rate, opens_at, admitted_at,
-- expires_at} ("" for none), or nil if its place needs the permutation (see the top)
local function room_place(r, seq, hint)
  local ph = room_phase(r)
  local rate = f17(room_eta_rate(r))
  local opens = opt17(r.cfg.opens_at)
  if ph == 'sold_out' or ph == 'closed' then return {ph, '', '', rate, opens, '', ''} end
  if ph == 'scheduled' then return {'pre_queue', seq, '', rate, opens, '', ''} end
  local where = room_place_of(r, seq, hint)
  if where == nil then return nil end
  if where > r.head then return {'waiting', seq, where - r.head - 1, rate, opens, '', ''} end
  local admitted_at, expires_at = room_step_of(r, where)
  local state
  if room_is_used(r, seq) then state = 'used'
  elseif NOW >= expires_at then state = 'expired'
  else state = 'admitted' end
  return {state, seq, 0, rate, opens, f17(admitted_at), f17(expires_at)}
end

local function room_sold_out(r)
  if r.sold_out_at == nil and r.closed_at == nil then
    rset(r, 'sold_out_at', NOW)
    rset(r, 'told_sold_out', r.joined - r.head)
  end
  return r.told_sold_out
end

-- burn the token of arrival seq: "ok", "used", "expired", "not_admitted", or nil if its
-- place needs the permutation
local function room_consume(r, seq, hint)
  if not r.drawn_at or seq < 1 or seq > r.joined then return 'not_admitted' end
  local where = room_place_of(r, seq, hint)
  if where == nil then return nil end
  if where > r.head then return 'not_admitted' end
  local _, expires_at = room_step_of(r, where)
  if NOW >= expires_at then return 'expired' end
  if redis.call('ZADD', r._base .. 'used', 'NX', where, seq) == 0 then return 'used' end
  rset(r, 'used', r.used + 1)
  if where > r.expired_upto then rset(r, 'used_live', r.used_live + 1) end
  return 'ok'
end

-- the hint of a step's ARGV at i, i+1, i+2 (seed, size, place; "" for none)
local function room_hint(i)
  if arg(i) == nil or arg(i) == '' then return nil end
  return {seed = arg(i), size = narg(i + 1), place = narg(i + 2)}
end

-- the row of KEYS[1], drawn if due with the seed at ARGV arg(1); nil if there is no room
local function room_open_step()
  local r = room_load(KEYS[1])
  if r == nil then return nil end
  room_draw_if_due(r, arg(1))
  return r
end
