-- release: end current leases at once, not counting the delivery as an attempt.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 k, then the k receipts ("id.lease") in one string
-- returns the positions of receipts that are not current leases
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ok, lost = current(q, 2)
for _, id in ipairs(ok) do
  redis.call('ZREM', q.l, id); redis.call('HDEL', q.k, id)
  if redis.call('HINCRBY', q.a, id, -1) <= 0 then redis.call('HDEL', q.a, id) end
  local prio = 0
  if q.maxp > 0 then local rec = record(q, id); prio = tonumber(rec and rec.p or 0) end
  redis.call('ZADD', q.r, ready_score(q, prio, NOW), id)
  wake(q.name)
end
if #ok > 0 then touch(q) end
finish()
return lost
