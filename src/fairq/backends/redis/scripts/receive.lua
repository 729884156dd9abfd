-- receive: lease up to n visible messages in delivery order (priority, availability, id),
-- dead-lettering those past retention.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 n, 3 visibility timeout ("" the queue's), 4 lease token
-- returns {next due time or "", {id, attempt, fields}...}
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local n, lease = narg(2), arg(4)
local until_ = NOW + (tonumber(arg(3)) or q.vt)
local out = {''}
local cutoff = id_at(NOW - q.retention)
while #out - 1 < n do
  local got = redis.call('ZPOPMIN', q.r, n - (#out - 1))
  if #got == 0 then break end
  for i = 1, #got, 2 do
    local id = got[i]
    if id < cutoff then
      dead_letter(q, id, nil, 'expired')
    else
      local attempt = redis.call('HINCRBY', q.a, id, 1)
      if attempt > 1 then redis.call('HINCRBY', q.n, 'redelivered', 1) end
      redis.call('ZADD', q.l, until_, id)
      redis.call('HSET', q.k, id, lease)
      out[#out + 1] = {id, attempt, fields_of(q, id) or {}}
    end
  end
  touch(q)
end
if #out == 1 then out[1] = tostring(queue_due(q) or '') end
finish()
return out
