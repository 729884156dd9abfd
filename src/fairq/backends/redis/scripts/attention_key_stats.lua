-- attention_key_stats: one step of the busiest keys' list (the client ranks by backlog, then
-- in flight, then name). Step "scan" reads one SSCAN chunk of the keys with backlog (A
-- backlog) from `cursor`; step "fill" lists keys without backlog by name, when fewer than
-- `top` keys have any. Each step is bounded (a chunk, or `top` keys), so no call walks a
-- domain of a million keys at once; the client decides how many chunks to read.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 top, 3 step ("scan" | "fill"), 4 cursor, 5 chunk
-- returns {next cursor ("0": done), {{key, tenant, plan, state, backlog, in_flight,
--          oldest id or "", active, pending, processed}...}} | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local top = narg(2)
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
local out = {}
if arg(3) == 'scan' then
  local scan = redis.call('SSCAN', d.a .. 'backlog', arg(4), 'COUNT', narg(5))
  for _, key in ipairs(scan[2]) do
    local r = row_of(key)
    if r then out[#out + 1] = r end
  end
  finish()
  return {scan[1], out}
end
-- fill: keys without backlog, by name (those with backlog were read by the scan)
local cursor = 0
while #out < top do
  local batch = redis.call('ZRANGE', d.a .. 'keys', cursor, cursor + 199)
  if #batch == 0 then break end
  for _, key in ipairs(batch) do
    if #out < top and redis.call('SISMEMBER', d.a .. 'backlog', key) == 0 then
      local r = row_of(key)
      if r then out[#out + 1] = r end
    end
  end
  cursor = cursor + 200
end
finish()
return {'0', out}
