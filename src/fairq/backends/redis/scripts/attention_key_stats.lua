-- attention_key_stats: the `top` keys by backlog, then in flight, then name: the keys with
-- backlog are looked at, then others (by name) fill the list.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 top
-- returns {{key, tenant, plan, state, backlog, in_flight, oldest id or "", active, pending,
--           processed}...} | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local top = narg(2)
local rows, seen = {}, {}
local function row_of(key)
  local k = load_key(d, key)
  if not k then return nil end
  local q = load_queue(k.queue)
  local backlog, in_flight, oldest = 0, 0, ''
  if q then
    backlog = redis.call('ZCARD', q.r) + redis.call('ZCARD', q.d)
      + tonumber(redis.call('HGET', q.n, 'blocked') or 0)
    in_flight = redis.call('ZCARD', q.l)
    local first = redis.call('XRANGE', q.s, '-', '+', 'COUNT', 1)
    if first[1] then oldest = hex_of_sid(first[1][1]) end
  end
  return {key, k.tenant, k.plan, k.state, backlog, in_flight, oldest, k.active, k.pending,
    k.processed}
end
for _, key in ipairs(redis.call('SMEMBERS', d.a .. 'backlog')) do
  local r = row_of(key)
  if r then rows[#rows + 1] = r; seen[key] = true end
end
table.sort(rows, function(x, y)
  if x[5] ~= y[5] then return x[5] > y[5] end
  if x[6] ~= y[6] then return x[6] > y[6] end
  return x[1] < y[1]
end)
local out = {}
for i = 1, math.min(top, #rows) do out[i] = rows[i] end
if #out < top then
  local extra = {}
  local cursor = 0
  while #out < top do
    local batch = redis.call('ZRANGE', d.a .. 'keys', cursor, cursor + 199)
    if #batch == 0 then break end
    for _, key in ipairs(batch) do
      if not seen[key] and #out < top then
        local r = row_of(key)
        if r then extra[#extra + 1] = r; out[#out + 1] = r end
      end
    end
    cursor = cursor + 200
  end
  -- keys with something in flight but no backlog still go before the idle ones
  table.sort(out, function(x, y)
    if x[5] ~= y[5] then return x[5] > y[5] end
    if x[6] ~= y[6] then return x[6] > y[6] end
    return x[1] < y[1]
  end)
end
finish()
return out
