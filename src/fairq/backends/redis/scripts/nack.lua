-- nack: end a lease without success: visible after delay, or dead-lettered after the
-- last allowed attempt.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 "1", 3 the receipt ("id.lease"), 4 delay, 5 the error (fairq.detail
-- of a dead letter; "" when none)
-- returns 1 | error FQ:LOST
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ok = current(q, 2)
if #ok == 0 then finish(); return fail('LOST') end
local id, delay = ok[1], narg(4)
redis.call('HINCRBY', q.n, 'nacked', 1)
local attempt = tonumber(redis.call('HGET', q.a, id) or 0)
if q.max_attempts and attempt >= q.max_attempts then
  dead_letter(q, id, 'l', 'max_attempts', arg(5), attempt)
else
  redis.call('ZREM', q.l, id); redis.call('HDEL', q.k, id); touch(q)
  local prio = 0
  if q.maxp > 0 then local rec = record(q, id); prio = tonumber(rec and rec.p or 0) end
  make_available(q, id, prio, NOW + delay)
  wake(q.name)
end
finish()
return 1
