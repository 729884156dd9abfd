-- stats: counts, the oldest message's id and the counters, after applying retention to
-- messages not in flight.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name
-- returns {visible, delayed, in_flight, oldest id or "", sent, acked, nacked, redelivered,
--          dead_lettered, expired, discarded, options JSON}
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local cutoff = id_at(NOW - q.retention)
local cursor = '-'
while true do
  local got = redis.call('XRANGE', q.s, cursor, sid(cutoff), 'COUNT', 500)
  if #got == 0 then break end
  for _, e in ipairs(got) do
    local id = hex_of_sid(e[1])
    if id < cutoff then
      local w = where_is(q, id)
      if w ~= 'l' then dead_letter(q, id, w, 'expired') end
    end
  end
  cursor = '(' .. got[#got][1]
end
local first = redis.call('XRANGE', q.s, '-', '+', 'COUNT', 1)
local oldest = first[1] and hex_of_sid(first[1][1]) or ''
local c = redis.call('HMGET', q.n, 'blocked', 'sent', 'acked', 'nacked', 'redelivered',
  'dead_lettered', 'expired', 'discarded')
local out = {redis.call('ZCARD', q.r) + tonumber(c[1] or 0), redis.call('ZCARD', q.d),
  redis.call('ZCARD', q.l), oldest}
for i = 2, 8 do out[#out + 1] = tonumber(c[i] or 0) end
out[#out + 1] = redis.call('HGET', q.fb .. 'queues', q.name)
finish()
return out
